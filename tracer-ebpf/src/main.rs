//! The eBPF programs: uprobes and uretprobes on the malloc family.
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
//! helpers here), the watcher of libraries loaded later in `libraries.rs`.
#![cfg_attr(target_arch = "bpf", no_std, no_main)]
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

#[cfg(not(target_arch = "bpf"))]
fn main() {
    eprintln!("tracer-ebpf holds eBPF programs; tracer/build.rs builds it for the bpf target");
}

#[cfg(target_arch = "bpf")]
mod gpu;
#[cfg(target_arch = "bpf")]
mod libraries;

#[cfg(target_arch = "bpf")]
mod probes {
    use aya_ebpf::{
        bindings::{BPF_ANY, BPF_F_USER_STACK, BPF_NOEXIST},
        helpers::{
            bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user, bpf_send_signal,
        },
        macros::{map, uprobe, uretprobe},
        maps::{HashMap, LruHashMap, PerCpuArray, StackTrace},
        programs::{ProbeContext, RetProbeContext, tracing::StackIdContext},
    };
    use tracer_ebpf::{
        LiveAlloc, LiveKey, NO_STACK, Pending, StackKey, StackTotals, call, kind, stat,
    };

    /// Per thread (pid_tgid): the allocator call in progress. LRU, so the
    /// entries of threads that exited make room by themselves.
    #[map]
    static PENDING: LruHashMap<u64, Pending> = LruHashMap::with_max_entries(16384, 0);

    /// Every outstanding block seen since attach.
    #[map]
    static LIVE: HashMap<LiveKey, LiveAlloc> = HashMap::with_max_entries(1 << 20, 0);

    /// Totals per (process, stack, kind): what userspace snapshots.
    #[map]
    static BY_STACK: HashMap<StackKey, StackTotals> = HashMap::with_max_entries(1 << 16, 0);

    /// User stacks, walked by frame pointers. No BPF_F_REUSE_STACKID: an
    /// overwritten stack would misattribute every live block that uses it.
    #[map]
    static STACKS: StackTrace = StackTrace::with_max_entries(1 << 14, 0);

    /// Event and drop counters, indexed by `tracer_ebpf::stat`.
    #[map]
    static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(stat::COUNT, 0);

    const EEXIST: i64 = 17;
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
    #[inline(always)]
    pub(crate) fn add_to_stack(key: &StackKey, bytes: u64, allocs: u64, allocated: bool) {
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
            pad: 0,
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
        let _ = LIVE.remove(&key);
        add_to_stack(
            &stack_key(tgid, &block),
            block.size.wrapping_neg(),
            u64::MAX,
            false,
        );
        Some(block)
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
            // call): retire it before reusing the address.
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
        add_to_stack(&stack_key(tgid, block), block.size, 1, allocated);
    }

    #[inline(always)]
    pub(crate) fn current_stack(ctx: &RetProbeContext) -> u32 {
        match ctx.get_stackid(&STACKS, BPF_F_USER_STACK as u64) {
            Ok(id) => id as u32,
            Err(error) => {
                count(if -(error as i64) == EEXIST {
                    stat::DROP_STACK_COLLISION
                } else {
                    stat::DROP_STACK_ERROR
                });
                NO_STACK
            }
        }
    }

    /// Entry of an allocator call: remembers its arguments unless another
    /// allocator call is already in progress on this thread. Returns true
    /// when this call is the outermost one.
    #[inline(always)]
    fn enter(call_kind: u32, size: u64, pointer: u64) -> Option<*mut Pending> {
        let thread = bpf_get_current_pid_tgid();
        if let Some(pending) = PENDING.get_ptr_mut(&thread) {
            unsafe {
                if (*pending).depth > 0 {
                    (*pending).depth += 1;
                    count(stat::NESTED_CALLS);
                    return None;
                }
                (*pending).size = size;
                (*pending).pointer = pointer;
                (*pending).call = call_kind;
                (*pending).depth = 1;
                (*pending).old_known = 0;
            }
            return Some(pending);
        }
        let pending = Pending {
            size,
            pointer,
            call: call_kind,
            depth: 1,
            ..Pending::default()
        };
        if PENDING.insert(&thread, &pending, BPF_ANY as u64).is_err() {
            count(stat::DROP_PENDING_FULL);
            return None;
        }
        PENDING.get_ptr_mut(&thread)
    }

    #[inline(always)]
    pub(crate) fn arg(ctx: &ProbeContext, index: usize) -> u64 {
        ctx.arg::<u64>(index).unwrap_or(0)
    }

    #[uprobe]
    pub fn malloc_enter(ctx: ProbeContext) -> u32 {
        enter(call::RETURNS_POINTER, arg(&ctx, 0), 0);
        0
    }

    #[uprobe]
    pub fn calloc_enter(ctx: ProbeContext) -> u32 {
        enter(
            call::RETURNS_POINTER,
            arg(&ctx, 0).wrapping_mul(arg(&ctx, 1)),
            0,
        );
        0
    }

    /// aligned_alloc(alignment, size) and memalign(alignment, size).
    #[uprobe]
    pub fn aligned_enter(ctx: ProbeContext) -> u32 {
        enter(call::RETURNS_POINTER, arg(&ctx, 1), 0);
        0
    }

    /// pvalloc rounds the size up to whole pages.
    #[uprobe]
    pub fn pvalloc_enter(ctx: ProbeContext) -> u32 {
        let size = arg(&ctx, 0).max(1).wrapping_add(PAGE_SIZE - 1) & !(PAGE_SIZE - 1);
        enter(call::RETURNS_POINTER, size, 0);
        0
    }

    #[uprobe]
    pub fn posix_memalign_enter(ctx: ProbeContext) -> u32 {
        enter(call::OUT_PARAMETER, arg(&ctx, 2), arg(&ctx, 0));
        0
    }

    #[uprobe]
    pub fn realloc_enter(ctx: ProbeContext) -> u32 {
        realloc_common(arg(&ctx, 0), arg(&ctx, 1));
        0
    }

    #[uprobe]
    pub fn reallocarray_enter(ctx: ProbeContext) -> u32 {
        realloc_common(arg(&ctx, 0), arg(&ctx, 1).wrapping_mul(arg(&ctx, 2)));
        0
    }

    /// realloc frees the old block at entry (it may be handed to another
    /// thread before realloc returns) and restores it if the call fails.
    #[inline(always)]
    fn realloc_common(old: u64, size: u64) {
        let Some(pending) = enter(call::REALLOC, size, old) else {
            return;
        };
        if old == 0 {
            return;
        }
        let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        match take_live(tgid, old) {
            Some(block) => unsafe {
                (*pending).old = block;
                (*pending).old_known = 1;
            },
            None => count(stat::FREES_UNKNOWN),
        }
    }

    #[uprobe]
    pub fn free_enter(ctx: ProbeContext) -> u32 {
        let address = arg(&ctx, 0);
        if address == 0 {
            count(stat::FREES_NULL);
            return 0;
        }
        let thread = bpf_get_current_pid_tgid();
        if let Some(pending) = PENDING.get_ptr(&thread)
            && unsafe { (*pending).depth } > 0
        {
            count(stat::NESTED_CALLS);
            return 0;
        }
        match take_live((thread >> 32) as u32, address) {
            Some(_) => count(stat::FREES),
            None => count(stat::FREES_UNKNOWN),
        }
        0
    }

    /// One return probe for every allocator function: what to do is in the
    /// pending call.
    #[uretprobe]
    pub fn alloc_return(ctx: RetProbeContext) -> u32 {
        let thread = bpf_get_current_pid_tgid();
        let Some(pending) = PENDING.get_ptr_mut(&thread) else {
            return 0;
        };
        let pending = unsafe { &mut *pending };
        if pending.depth == 0 {
            // The call started before the probes were attached.
            return 0;
        }
        pending.depth -= 1;
        if pending.depth > 0 {
            return 0;
        }
        let tgid = (thread >> 32) as u32;
        let result: u64 = ctx.ret();
        let address = match pending.call {
            call::OUT_PARAMETER => {
                if result as u32 != 0 {
                    count(stat::FAILED_ALLOCS);
                    return 0;
                }
                match unsafe { bpf_probe_read_user(pending.pointer as *const u64) } {
                    Ok(address) => address,
                    Err(_) => {
                        count(stat::DROP_READ_OUT_PARAM);
                        return 0;
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
                    return 0;
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
            return 0;
        }
        let block = LiveAlloc {
            size: pending.size,
            stack_id: current_stack(&ctx),
            kind: kind::HEAP,
            timestamp_ns: unsafe { bpf_ktime_get_ns() },
        };
        put_live(tgid, address, &block, true);
        count(stat::ALLOCS);
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
