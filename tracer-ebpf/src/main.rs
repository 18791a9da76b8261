//! The eBPF programs: uprobes and uretprobes (or uprobe sessions) on the
//! malloc family, and the benchmark's empty floor programs. The mapping
//! system calls' tracepoints are in `mappings.rs`.
//!
//! Every program here runs once per allocator call of the target, so each
//! does the least it can: carry arguments from entry to return in PENDING,
//! keep one LIVE entry per outstanding block, and add to the per-stack
//! totals in BY_STACK with atomic adds. Nothing is sent to userspace per
//! allocation; userspace reads BY_STACK and STATS on a timer.
//!
//! Only the outermost allocator call on a thread counts: when an allocator
//! calls another exported allocator function (glibc's `reallocarray` calls
//! `realloc`, `realloc(p, 0)` calls `free`), the inner call only moves the
//! thread's depth counter, so nothing is counted twice.
//!
//! The CUDA probes are in `gpu.rs` (they share LIVE, BY_STACK and the
//! helpers here), the watcher of libraries loaded later in `libraries.rs`,
//! which allocations are recorded in `sampling.rs`, and where a block's
//! stack comes from (a frame-pointer walk or a copy) in `stacks.rs`.
#![cfg_attr(target_arch = "bpf", no_std, no_main)]
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

#[cfg(not(target_arch = "bpf"))]
fn main() {
    eprintln!("tracer-ebpf holds eBPF programs; tracer/build.rs builds it for the bpf target");
}

#[cfg(target_arch = "bpf")]
mod forks;
#[cfg(target_arch = "bpf")]
mod gpu;
#[cfg(target_arch = "bpf")]
mod libraries;
#[cfg(target_arch = "bpf")]
mod mappings;
#[cfg(target_arch = "bpf")]
mod sampling;
#[cfg(target_arch = "bpf")]
mod signals;
#[cfg(target_arch = "bpf")]
mod stacks;

#[cfg(target_arch = "bpf")]
mod probes {
    use aya_ebpf::{
        EbpfContext as _,
        bindings::{BPF_ANY, BPF_NOEXIST},
        helpers::{
            bpf_get_attach_cookie, bpf_get_current_pid_tgid, bpf_ktime_get_ns,
            bpf_probe_read_kernel, bpf_probe_read_user, bpf_send_signal,
        },
        macros::{map, uprobe, uretprobe},
        maps::{HashMap, LruHashMap, PerCpuArray, StackTrace},
        programs::{ProbeContext, RetProbeContext},
    };
    use tracer_ebpf::{
        LiveAlloc, LiveKey, Pending, StackKey, StackTotals, argument_register, call,
        is_copied_stack, kind, stack_record, stat,
    };

    /// Per thread (pid_tgid): the allocator call in progress. LRU, so the
    /// entries of threads that exited make room by themselves.
    #[map]
    pub(crate) static PENDING: LruHashMap<u64, Pending> = LruHashMap::with_max_entries(16384, 0);

    /// Every outstanding block seen since attach.
    #[map]
    static LIVE: HashMap<LiveKey, LiveAlloc> = HashMap::with_max_entries(1 << 20, 0);

    /// Totals per (process, stack, kind): what userspace snapshots.
    #[map]
    static BY_STACK: HashMap<StackKey, StackTotals> = HashMap::with_max_entries(1 << 16, 0);

    /// User stacks, walked by frame pointers. No BPF_F_REUSE_STACKID: an
    /// overwritten stack would misattribute every live block that uses it.
    #[map]
    pub(crate) static STACKS: StackTrace = StackTrace::with_max_entries(1 << 14, 0);

    /// Event and drop counters, indexed by `tracer_ebpf::stat`.
    #[map]
    static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(stat::COUNT, 0);

    const SIGSTOP: u32 = 19;
    const PAGE_SIZE: u64 = 4096;

    /// `*target += value` as one atomic instruction, so concurrent threads
    /// of the target never lose an update.
    #[inline(always)]
    pub(crate) fn atomic_add(target: *mut u64, value: u64) {
        unsafe {
            core::arch::asm!(
                "lock *(u64 *)({target} + 0) += {value}",
                target = in(reg) target,
                value = in(reg) value,
            );
        }
    }

    #[inline(always)]
    pub(crate) fn count(index: u32) {
        if let Some(counter) = STATS.get_ptr_mut(index) {
            atomic_add(counter, 1);
        }
    }

    /// Adds a signed change to a stack's totals, creating the entry on
    /// first use. `allocated` also counts the call in the running totals.
    /// A copied stack's totals are kept by userspace: a block leaving the
    /// live set (`allocs` is -1) is sent to it instead.
    #[inline(always)]
    pub(crate) fn add_to_stack(key: &StackKey, bytes: u64, allocs: u64, allocated: bool) {
        if is_copied_stack(key.stack_id) {
            if allocs == u64::MAX {
                crate::stacks::send_free(key.tgid, key.stack_id, stack_record::FREE);
            }
            return;
        }
        let totals = match BY_STACK.get_ptr_mut(key) {
            Some(totals) => totals,
            None => {
                let _ = BY_STACK.insert(key, StackTotals::default(), BPF_NOEXIST as u64);
                match BY_STACK.get_ptr_mut(key) {
                    Some(totals) => totals,
                    None => {
                        count(stat::DROP_BY_STACK_FULL);
                        return;
                    }
                }
            }
        };
        unsafe {
            atomic_add(&raw mut (*totals).live_bytes, bytes);
            atomic_add(&raw mut (*totals).live_allocs, allocs);
            if allocated {
                atomic_add(&raw mut (*totals).alloc_bytes, bytes);
                atomic_add(&raw mut (*totals).alloc_count, 1);
            }
        }
    }

    #[inline(always)]
    pub(crate) fn stack_key(tgid: u32, block: &LiveAlloc) -> StackKey {
        StackKey {
            tgid,
            stack_id: block.stack_id,
            kind: block.kind,
            context_epoch: block.context_epoch,
        }
    }

    /// Takes a block out of the live set; returns what it held.
    #[inline(always)]
    pub(crate) fn take_live(tgid: u32, address: u64) -> Option<LiveAlloc> {
        let key = LiveKey {
            tgid,
            pad: 0,
            address,
        };
        let block = unsafe { *LIVE.get(&key)? };
        if released_without_free(tgid, &block) {
            // Userspace no longer counts it (see `released_without_free`).
            let _ = LIVE.remove(&key);
            return None;
        }
        retire(&key, &block);
        Some(block)
    }

    /// When each traced process last exec'ed (ktime ns, set by
    /// `libraries.rs`): older blocks belonged to an image that is gone.
    #[map]
    pub(crate) static EXEC_TIME: HashMap<u32, u64> = HashMap::with_max_entries(4096, 0);

    /// Whether a block went away without a free: its image was replaced
    /// (exec; userspace took it off the totals then), or the CUDA context
    /// that owned it was destroyed (its epoch's totals are frozen, and
    /// userspace counts them as released).
    #[inline(always)]
    fn released_without_free(tgid: u32, block: &LiveAlloc) -> bool {
        unsafe { EXEC_TIME.get(&tgid) }.is_some_and(|&exec_ns| block.timestamp_ns < exec_ns)
            || crate::gpu::context_destroyed(tgid, block)
    }

    /// Removes a live block and takes it off its stack's totals.
    #[inline(always)]
    fn retire(key: &LiveKey, block: &LiveAlloc) {
        let _ = LIVE.remove(key);
        add_to_stack(
            &stack_key(key.tgid, block),
            block.size.wrapping_neg(),
            u64::MAX,
            false,
        );
    }

    #[inline(always)]
    pub(crate) fn put_live(tgid: u32, address: u64, block: &LiveAlloc, allocated: bool) {
        let key = LiveKey {
            tgid,
            pad: 0,
            address,
        };
        if let Some(stale) = LIVE.get_ptr_mut(&key) {
            // The block's free was not seen (made inside another allocator
            // call, or its image or CUDA context is gone): retire it before
            // reusing the address.
            if released_without_free(tgid, unsafe { &*stale }) {
                unsafe { *stale = *block };
                add_to_stack(&stack_key(tgid, block), block.size, 1, allocated);
                return;
            }
            unsafe {
                add_to_stack(
                    &stack_key(tgid, &*stale),
                    (*stale).size.wrapping_neg(),
                    u64::MAX,
                    false,
                );
                *stale = *block;
            }
        } else if LIVE.insert(&key, block, BPF_NOEXIST as u64).is_err() {
            count(stat::DROP_LIVE_FULL);
            if is_copied_stack(block.stack_id) {
                // Userspace counted the copy as live: take it off again.
                crate::stacks::send_free(tgid, block.stack_id, stack_record::FREE);
                return;
            }
            // Keep the call in the running totals; the live figures stay
            // exact for every block that is tracked.
            let key = stack_key(tgid, block);
            add_to_stack(&key, 0, 0, false);
            if let Some(totals) = BY_STACK.get_ptr_mut(&key) {
                unsafe {
                    atomic_add(&raw mut (*totals).alloc_bytes, block.size);
                    atomic_add(&raw mut (*totals).alloc_count, 1);
                }
            }
            return;
        }
        if !allocated && is_copied_stack(block.stack_id) {
            // A failed realloc's old block, taken off at its entry.
            crate::stacks::send_free(tgid, block.stack_id, stack_record::RESTORE);
        }
        add_to_stack(&stack_key(tgid, block), block.size, 1, allocated);
    }

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
        if sp < pending.unrecorded_sp
            && unsafe { bpf_probe_read_user(pending.unrecorded_sp as *const u64) }
                .is_ok_and(|word| word == pending.unrecorded_return || is_uprobe_trampoline(word))
        {
            return true;
        }
        pending.unrecorded_sp = 0;
        false
    }

    /// Whether a return address is the uprobe trampoline's, which the kernel
    /// writes over the return address of a probed call (a uprobe session
    /// whose entry skipped the return included, on Linux 6.18): the page
    /// at the top of the user address space, with 47- or 56-bit addresses.
    #[inline(always)]
    fn is_uprobe_trampoline(address: u64) -> bool {
        address >> 12 == 0x7_ffff_fffe || address >> 12 == 0xff_ffff_ffff_fffe
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

    #[inline(always)]
    pub(crate) fn arg(ctx: &ProbeContext, index: usize) -> u64 {
        ctx.arg::<u64>(index).unwrap_or(0)
    }

    /// Argument `index` of a malloc-family call: from the register the
    /// attach cookie names when the probe sits after the function moved it
    /// (`tracer_ebpf::argument_register`), else from its own. The moved
    /// register is read with a helper: the verifier allows only constant
    /// offsets into the context.
    #[inline(always)]
    fn call_arg(ctx: &ProbeContext, index: usize) -> u64 {
        let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
        let register = ((cookie >> (8 * index)) & 0xff) as usize;
        if register == 0 || register > argument_register::RDI as usize {
            return arg(ctx, index);
        }
        let word = unsafe { (ctx.regs as *const u64).add(register - 1) };
        unsafe { bpf_probe_read_kernel(word) }.unwrap_or(0)
    }

    /// `bpf_session_is_return()`: a kfunc, which aya cannot relocate. The
    /// call is emitted with a placeholder helper id that tracer's session
    /// loader (`attach/session.rs`) rewrites into a kfunc call; aya never
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
                let $in_session = false;
                let _ = $body;
                0
            }

            #[uprobe]
            pub fn $session($ctx: ProbeContext) -> u32 {
                let $in_session = true;
                if session_is_return() {
                    on_return(&RetProbeContext::new($ctx.as_ptr()));
                    return 0;
                }
                $body.session_verdict()
            }
        };
    }

    entry_programs!(malloc_enter, malloc_session, |ctx, in_session| enter(
        &ctx,
        in_session,
        call::RETURNS_POINTER,
        call_arg(&ctx, 0),
        0,
        false
    ));
    entry_programs!(calloc_enter, calloc_session, |ctx, in_session| enter(
        &ctx,
        in_session,
        call::RETURNS_POINTER,
        call_arg(&ctx, 0).wrapping_mul(call_arg(&ctx, 1)),
        0,
        false
    ));
    // aligned_alloc(alignment, size) and memalign(alignment, size).
    entry_programs!(aligned_enter, aligned_session, |ctx, in_session| enter(
        &ctx,
        in_session,
        call::RETURNS_POINTER,
        call_arg(&ctx, 1),
        0,
        false
    ));
    // pvalloc rounds the size up to whole pages.
    entry_programs!(pvalloc_enter, pvalloc_session, |ctx, in_session| enter(
        &ctx,
        in_session,
        call::RETURNS_POINTER,
        call_arg(&ctx, 0).max(1).wrapping_add(PAGE_SIZE - 1) & !(PAGE_SIZE - 1),
        0,
        false
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
            false
        )
    );
    entry_programs!(realloc_enter, realloc_session, |ctx, in_session| {
        realloc_common(&ctx, in_session, call_arg(&ctx, 0), call_arg(&ctx, 1))
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
            )
        }
    );

    /// realloc frees the old block at entry (it may be handed to another
    /// thread before realloc returns) and restores it if the call fails.
    #[inline(always)]
    fn realloc_common(ctx: &ProbeContext, in_session: bool, old: u64, size: u64) -> Entered {
        let entered = enter(ctx, in_session, call::REALLOC, size, old, true);
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
    /// before attach, or not sampled).
    #[uprobe]
    pub fn free_enter(ctx: ProbeContext) -> u32 {
        let address = call_arg(&ctx, 0);
        if address == 0 {
            count(stat::FREES_NULL);
            return 0;
        }
        let thread = bpf_get_current_pid_tgid();
        let key = LiveKey {
            tgid: (thread >> 32) as u32,
            pad: 0,
            address,
        };
        let nested = || {
            PENDING
                .get_ptr(&thread)
                .is_some_and(|pending| unsafe { (*pending).depth } > 0)
        };
        let Some(block) = (unsafe { LIVE.get(&key) }).copied() else {
            // mimalloc's realloc frees the old block through `free`, after
            // realloc's entry took it off: not a block from before attach.
            count(if nested() {
                stat::NESTED_CALLS
            } else {
                stat::FREES_UNKNOWN
            });
            return 0;
        };
        if nested() {
            count(stat::NESTED_CALLS);
            return 0;
        }
        retire(&key, &block);
        count(stat::FREES);
        0
    }

    /// One return probe for every allocator function: what to do is in the
    /// pending call.
    #[uretprobe]
    pub fn alloc_return(ctx: RetProbeContext) -> u32 {
        on_return(&ctx);
        0
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
                kind::HEAP,
                u32::MAX,
                0,
            ),
            kind: kind::HEAP,
            timestamp_ns: unsafe { bpf_ktime_get_ns() },
            ..LiveAlloc::default()
        };
        put_live(tgid, address, &block, true);
        count(stat::ALLOCS);
    }

    /// The benchmark's floors (`tracer floor`): empty programs, to measure
    /// what a probe hit costs by itself at a given site.
    #[uprobe]
    pub fn floor_enter(_ctx: ProbeContext) -> u32 {
        0
    }

    #[uretprobe]
    pub fn floor_return(_ctx: RetProbeContext) -> u32 {
        0
    }

    /// Spawn mode: stops a freshly exec'ed child at its entry point, after
    /// the dynamic loader mapped its libraries, so userspace can attach
    /// before the program's first allocation. Scoped to the child's PID.
    #[uprobe]
    pub fn spawn_gate(_ctx: ProbeContext) -> u32 {
        unsafe {
            bpf_send_signal(SIGSTOP);
        }
        0
    }

    #[panic_handler]
    fn panic(_info: &core::panic::PanicInfo) -> ! {
        loop {}
    }
}
