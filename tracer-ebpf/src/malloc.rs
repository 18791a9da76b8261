//! The malloc family's programs: uprobes and uretprobes (or uprobe
//! sessions) on malloc, calloc, realloc, reallocarray, free,
//! posix_memalign, aligned_alloc, memalign, valloc and pvalloc.
//!
//! Every program here runs once per allocator call of the target, so each
//! does the least it can: carry arguments from entry to return in PENDING,
//! and hand the new or freed block to the live set (`live.rs`), which keeps
//! one LIVE entry per outstanding block and the per-stack totals. Nothing
//! is sent to userspace per allocation; userspace reads BY_STACK and STATS
//! on a timer.
//!
//! Only the outermost allocator call on a thread counts: when an allocator
//! calls another exported allocator function (glibc's `reallocarray` calls
//! `realloc`, `realloc(p, 0)` calls `free`), the inner call only moves the
//! thread's depth counter, so nothing is counted twice.
//!
//! Long: the malloc family's ten entry and return programs, which share one
//! pending-call state.
use aya_ebpf::{
    EbpfContext as _,
    bindings::BPF_ANY,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user},
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use tracer_ebpf::{LiveAlloc, Pending, call, counted, kind, stat};

use crate::{
    args::call_arg,
    counters::count,
    live::{find_live, free_live, live_key, put_live, take_live},
    pending::{PENDING, still_inside},
    runs::counted_run,
};

const PAGE_SIZE: u64 = 4096;

/// The result of an entry probe.
enum Entered {
    /// The outermost allocator call of the thread, to be recorded (or,
    /// for realloc, to free its old block): the return probe must run.
    Outermost(*mut Pending),
    /// Inside another allocator call: the return probe must run to move
    /// the depth back.
    Nested,
    /// Nothing to do at return (not recorded, or no room in PENDING).
    Untracked,
}

impl Entered {
    /// Whether the return probe must run: what a session program's
    /// entry tells the kernel (0: run it, 1: skip it).
    #[inline(always)]
    fn session_verdict(&self) -> u32 {
        match self {
            Entered::Untracked => 1,
            _ => 0,
        }
    }
}

/// The thread's pending slot, created with a seeded random state on
/// the thread's first allocator call.
#[inline(always)]
fn pending_slot(thread: u64) -> Option<*mut Pending> {
    if let Some(pending) = PENDING.get_ptr_mut(&thread) {
        return Some(pending);
    }
    let pending = Pending {
        random_state: crate::sampling::seed_for(thread),
        ..Pending::default()
    };
    if PENDING.insert(&thread, &pending, BPF_ANY as u64).is_err() {
        count(stat::DROP_PENDING_FULL);
        return None;
    }
    PENDING.get_ptr_mut(&thread)
}

/// Entry of an allocator call: remembers its arguments and what its new
/// block counts for, unless another allocator call is in progress on
/// this thread. A call whose block is not recorded (filtered out, not
/// sampled) is `Untracked` unless `keep_unrecorded` (realloc, which
/// still frees its old block).
#[inline(always)]
fn enter(
    ctx: &ProbeContext,
    in_session: bool,
    call_kind: u32,
    size: u64,
    pointer: u64,
    keep_unrecorded: bool,
    block_kind: u32,
) -> Entered {
    let thread = bpf_get_current_pid_tgid();
    let Some(pending) = pending_slot(thread) else {
        return Entered::Untracked;
    };
    let pending = unsafe { &mut *pending };
    if pending.depth > 0 {
        pending.depth += 1;
        count(stat::NESTED_CALLS);
        return Entered::Nested;
    }
    if inside_unrecorded_call(ctx, pending) {
        count(stat::NESTED_CALLS);
        return Entered::Untracked;
    }
    let recorded_bytes = crate::sampling::recorded_bytes(size, &mut pending.random_state);
    if recorded_bytes == 0 {
        count(stat::NOT_RECORDED);
        // A session skips the return of a call it does not record and
        // remembers where the call is; a uretprobe returns anyway, so
        // the call is tracked, recording nothing. Either way the calls
        // made inside it (operator new's malloc) are not recorded.
        if !keep_unrecorded && in_session {
            mark_unrecorded_call(ctx, pending);
            return Entered::Untracked;
        }
    }
    pending.size = size;
    pending.pointer = pointer;
    pending.recorded_bytes = recorded_bytes;
    pending.call = call_kind;
    pending.kind = block_kind;
    pending.depth = 1;
    pending.return_address = crate::stacks::return_address_at_entry(ctx);
    pending.old_known = 0;
    Entered::Outermost(pending)
}

/// Whether this call is made inside the thread's last unrecorded
/// outermost call, which is still in progress. Forgets that call once
/// it has returned.
#[inline(always)]
fn inside_unrecorded_call(ctx: &ProbeContext, pending: &mut Pending) -> bool {
    if pending.unrecorded_sp == 0 {
        return false;
    }
    let sp = unsafe { (*ctx.regs).rsp };
    if still_inside(pending.unrecorded_sp, pending.unrecorded_return, sp) {
        return true;
    }
    pending.unrecorded_sp = 0;
    false
}

/// Remembers an outermost call that is not recorded and skips its
/// return (see `Pending::unrecorded_sp`).
#[inline(always)]
fn mark_unrecorded_call(ctx: &ProbeContext, pending: &mut Pending) {
    let sp = unsafe { (*ctx.regs).rsp };
    if let Ok(return_address) = unsafe { bpf_probe_read_user(sp as *const u64) } {
        pending.unrecorded_sp = sp;
        pending.unrecorded_return = return_address;
    }
}
/// `bpf_session_is_return()`: a kfunc, which aya cannot relocate. The
/// call is emitted with a placeholder helper id that tracer's session
/// loader (`attach/load/raw.rs`) rewrites into a kfunc call; aya never
/// loads the `*_session` programs.
#[inline(always)]
fn session_is_return() -> bool {
    let result: u64;
    unsafe {
        core::arch::asm!(
            "call 0x7eadbeef",
            lateout("r0") result,
            lateout("r1") _,
            lateout("r2") _,
            lateout("r3") _,
            lateout("r4") _,
            lateout("r5") _,
        );
    }
    result & 0xff != 0
}

/// One entry shape, two programs: `$entry` (a plain uprobe, with the
/// `alloc_return` uretprobe next to it) and `$session` (a uprobe
/// session program: the same entry, and at return what `alloc_return`
/// does; its entry skips the return when nothing is pending).
macro_rules! entry_programs {
    ($entry:ident, $session:ident, |$ctx:ident, $in_session:ident| $body:expr) => {
        #[uprobe]
        pub fn $entry($ctx: ProbeContext) -> u32 {
            counted_run(const { counted::id_of(stringify!($entry)) }, || {
                let $in_session = false;
                let _ = $body;
                0
            })
        }

        // Entry and return are calls of their own: inlined together,
        // their frames would be one (280 bytes), and with the stack
        // walk under the return the verifier's 512-byte bound on a
        // chain of frames is passed.
        #[uprobe]
        pub fn $session(ctx: ProbeContext) -> u32 {
            #[inline(never)]
            fn session_return(ctx: *mut core::ffi::c_void) -> u32 {
                on_return(&RetProbeContext::new(ctx));
                0
            }
            #[inline(never)]
            fn session_enter(ctx: *mut core::ffi::c_void) -> u32 {
                let $ctx = ProbeContext::new(ctx);
                let $in_session = true;
                $body.session_verdict()
            }
            counted_run(const { counted::id_of(stringify!($session)) }, || {
                if session_is_return() {
                    return session_return(ctx.as_ptr());
                }
                session_enter(ctx.as_ptr())
            })
        }
    };
}

entry_programs!(malloc_enter, malloc_session, |ctx, in_session| enter(
    &ctx,
    in_session,
    call::RETURNS_POINTER,
    call_arg(&ctx, 0),
    0,
    false,
    kind::HEAP
));
entry_programs!(calloc_enter, calloc_session, |ctx, in_session| enter(
    &ctx,
    in_session,
    call::RETURNS_POINTER,
    call_arg(&ctx, 0).wrapping_mul(call_arg(&ctx, 1)),
    0,
    false,
    kind::HEAP
));
// aligned_alloc(alignment, size) and memalign(alignment, size).
entry_programs!(aligned_enter, aligned_session, |ctx, in_session| enter(
    &ctx,
    in_session,
    call::RETURNS_POINTER,
    call_arg(&ctx, 1),
    0,
    false,
    kind::HEAP
));
// pvalloc rounds the size up to whole pages.
entry_programs!(pvalloc_enter, pvalloc_session, |ctx, in_session| enter(
    &ctx,
    in_session,
    call::RETURNS_POINTER,
    call_arg(&ctx, 0).max(1).wrapping_add(PAGE_SIZE - 1) & !(PAGE_SIZE - 1),
    0,
    false,
    kind::HEAP
));
entry_programs!(
    posix_memalign_enter,
    posix_memalign_session,
    |ctx, in_session| enter(
        &ctx,
        in_session,
        call::OUT_PARAMETER,
        call_arg(&ctx, 2),
        call_arg(&ctx, 0),
        false,
        kind::HEAP
    )
);
entry_programs!(realloc_enter, realloc_session, |ctx, in_session| {
    realloc_common(
        &ctx,
        in_session,
        call_arg(&ctx, 0),
        call_arg(&ctx, 1),
        kind::HEAP,
    )
});
entry_programs!(
    reallocarray_enter,
    reallocarray_session,
    |ctx, in_session| {
        realloc_common(
            &ctx,
            in_session,
            call_arg(&ctx, 0),
            call_arg(&ctx, 1).wrapping_mul(call_arg(&ctx, 2)),
            kind::HEAP,
        )
    }
);

// CPython's allocator (`--python-objects`): PyObject_Malloc and
// PyMem_Malloc (size), PyObject_Calloc and PyMem_Calloc (count, size),
// PyObject_Realloc and PyMem_Realloc (old, size); their frees go to
// `free_enter`. The malloc or mmap they make inside is nested: their
// block counts once, as a Python object.
entry_programs!(
    pyobject_malloc_enter,
    pyobject_malloc_session,
    |ctx, in_session| enter(
        &ctx,
        in_session,
        call::RETURNS_POINTER,
        call_arg(&ctx, 0),
        0,
        false,
        kind::PYTHON_OBJECT
    )
);
entry_programs!(
    pyobject_calloc_enter,
    pyobject_calloc_session,
    |ctx, in_session| enter(
        &ctx,
        in_session,
        call::RETURNS_POINTER,
        call_arg(&ctx, 0).wrapping_mul(call_arg(&ctx, 1)),
        0,
        false,
        kind::PYTHON_OBJECT
    )
);
entry_programs!(
    pyobject_realloc_enter,
    pyobject_realloc_session,
    |ctx, in_session| {
        realloc_common(
            &ctx,
            in_session,
            call_arg(&ctx, 0),
            call_arg(&ctx, 1),
            kind::PYTHON_OBJECT,
        )
    }
);

/// realloc frees the old block at entry (it may be handed to another
/// thread before realloc returns) and restores it if the call fails.
#[inline(always)]
fn realloc_common(
    ctx: &ProbeContext,
    in_session: bool,
    old: u64,
    size: u64,
    block_kind: u32,
) -> Entered {
    let entered = enter(ctx, in_session, call::REALLOC, size, old, true, block_kind);
    let Entered::Outermost(pending) = entered else {
        return entered;
    };
    let pending = unsafe { &mut *pending };
    if old != 0 {
        let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        match take_live(tgid, old) {
            Some(block) => {
                pending.old = block;
                pending.old_known = 1;
            }
            None => count(stat::FREES_UNKNOWN),
        }
    }
    if pending.old_known == 0 && pending.recorded_bytes == 0 && in_session {
        // Neither a known block to free nor a new one to record: the
        // return is skipped (with a uretprobe, the call stays tracked
        // so that calls inside it count as nested).
        pending.depth = 0;
        mark_unrecorded_call(ctx, pending);
        return Entered::Untracked;
    }
    entered
}

/// free: one LIVE lookup for a block that was never recorded (allocated
/// before attach, or not sampled). An outermost free is marked in the
/// thread's PENDING slot (its stack pointer and return address), so the
/// mappings it makes (glibc makes a thread's arena inside its first
/// free) are known to be the allocator's.
#[uprobe]
pub fn free_enter(ctx: ProbeContext) -> u32 {
    counted_run(counted::FREE_ENTER, || {
        let address = call_arg(&ctx, 0);
        if address == 0 {
            count(stat::FREES_NULL);
            return 0;
        }
        let thread = bpf_get_current_pid_tgid();
        let pending = pending_slot(thread).map(|pending| unsafe { &mut *pending });
        let nested = pending.as_ref().is_some_and(|pending| pending.depth > 0);
        let key = live_key((thread >> 32) as u32, address);
        let Some(block) = find_live(&key) else {
            // mimalloc's realloc frees the old block through `free`, after
            // realloc's entry took it off; CPython's `PyObject_Free` frees
            // a block over 512 bytes through `free`, after its own probe
            // took it off: neither is a block from before attach.
            let inside_free = !nested
                && pending.as_ref().is_some_and(|pending| {
                    still_inside(pending.free_sp, pending.free_return, unsafe {
                        (*ctx.regs).rsp
                    })
                });
            if !nested && !inside_free {
                if let Some(pending) = pending {
                    mark_free_call(&ctx, pending);
                }
            }
            count(if nested || inside_free {
                stat::NESTED_CALLS
            } else {
                stat::FREES_UNKNOWN
            });
            return 0;
        };
        if nested {
            count(stat::NESTED_CALLS);
            return 0;
        }
        if let Some(pending) = pending {
            mark_free_call(&ctx, pending);
        }
        if free_live(&key, &block) {
            count(stat::FREES);
        }
        0
    })
}

/// Remembers the free entered now (see `Pending::free_sp`).
#[inline(always)]
fn mark_free_call(ctx: &ProbeContext, pending: &mut Pending) {
    let sp = unsafe { (*ctx.regs).rsp };
    match unsafe { bpf_probe_read_user(sp as *const u64) } {
        Ok(return_address) => {
            pending.free_sp = sp;
            pending.free_return = return_address;
        }
        Err(_) => pending.free_sp = 0,
    }
}

/// One return probe for every allocator function: what to do is in the
/// pending call.
#[uretprobe]
pub fn alloc_return(ctx: RetProbeContext) -> u32 {
    counted_run(counted::ALLOC_RETURN, || {
        on_return(&ctx);
        0
    })
}

#[inline(always)]
fn on_return(ctx: &RetProbeContext) {
    let thread = bpf_get_current_pid_tgid();
    let Some(pending) = PENDING.get_ptr_mut(&thread) else {
        return;
    };
    let pending = unsafe { &mut *pending };
    if pending.depth == 0 {
        // The call started before the probes were attached, or was not
        // recorded.
        return;
    }
    pending.depth -= 1;
    if pending.depth > 0 {
        return;
    }
    let tgid = (thread >> 32) as u32;
    let result: u64 = ctx.ret();
    let address = match pending.call {
        call::OUT_PARAMETER => {
            if result as u32 != 0 {
                count(stat::FAILED_ALLOCS);
                return;
            }
            match unsafe { bpf_probe_read_user(pending.pointer as *const u64) } {
                Ok(address) => address,
                Err(_) => {
                    count(stat::DROP_READ_OUT_PARAM);
                    return;
                }
            }
        }
        call::REALLOC => {
            if result == 0 {
                if pending.size != 0 && pending.old_known != 0 {
                    // Failed: the old block is still valid.
                    put_live(tgid, pending.pointer, &pending.old, false);
                } else if pending.old_known != 0 && pending.size == 0 {
                    count(stat::FREES);
                }
                if pending.size != 0 {
                    count(stat::FAILED_ALLOCS);
                }
                return;
            }
            if pending.old_known != 0 {
                count(stat::FREES);
            }
            result
        }
        _ => result,
    };
    if address == 0 {
        count(stat::FAILED_ALLOCS);
        return;
    }
    if pending.recorded_bytes == 0 {
        return;
    }
    let block = LiveAlloc {
        size: pending.recorded_bytes,
        stack_id: crate::stacks::capture(
            ctx,
            pending.return_address,
            pending.recorded_bytes,
            pending.kind,
            u32::MAX,
            0,
        ),
        kind: pending.kind,
        timestamp_ns: unsafe { bpf_ktime_get_ns() },
        ..LiveAlloc::default()
    };
    put_live(tgid, address, &block, true);
    count(stat::ALLOCS);
}
