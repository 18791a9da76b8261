//! The live set, shared by every program that allocates or frees: LIVE
//! keeps one entry per outstanding block seen since attach, BY_STACK the
//! totals per (process, stack, kind, context epoch) that userspace
//! snapshots, updated here with atomic adds.
//!
//! A block can also go away without a free: its image was replaced (exec,
//! EXEC_TIME) or the CUDA context that owned it was destroyed
//! (CONTEXT_EPOCH; see `gpu.rs`). Such a block is no longer counted, so
//! taking it out of LIVE leaves the totals alone.
//!
//! Copied-stack blocks (`--unwind dwarf`) are counted by userspace instead
//! of in BY_STACK: their removals are sent to it as free records.
use aya_ebpf::{bindings::BPF_NOEXIST, macros::map, maps::HashMap};
use tracer_ebpf::{
    FIRST_CONTEXT_EPOCH, LiveAlloc, LiveKey, StackKey, StackTotals, is_copied_stack, stack_record,
    stat,
};

use crate::counters::{atomic_add, count, fetch_add};

/// Every outstanding block seen since attach.
#[map]
pub(crate) static LIVE: HashMap<LiveKey, LiveAlloc> = HashMap::with_max_entries(1 << 20, 0);

/// Totals per (process, stack, kind): what userspace snapshots.
#[map]
static BY_STACK: HashMap<StackKey, StackTotals> = HashMap::with_max_entries(1 << 16, 0);

/// When each traced process last exec'ed (ktime ns, set by
/// `libraries.rs`): older blocks belonged to an image that is gone.
#[map]
pub(crate) static EXEC_TIME: HashMap<u32, u64> = HashMap::with_max_entries(4096, 0);

/// The current CUDA context epoch of each process that ended one (absent:
/// `FIRST_CONTEXT_EPOCH`).
#[map]
static CONTEXT_EPOCH: HashMap<u32, u64> = HashMap::with_max_entries(4096, 0);

#[inline(always)]
pub(crate) fn context_epoch(tgid: u32) -> u32 {
    unsafe { CONTEXT_EPOCH.get(&tgid) }.map_or(FIRST_CONTEXT_EPOCH, |&epoch| epoch as u32)
}

/// Whether the CUDA context that owned a block was destroyed since it was
/// allocated.
#[inline(always)]
fn context_destroyed(tgid: u32, block: &LiveAlloc) -> bool {
    block.context_epoch != 0 && block.context_epoch != context_epoch(tgid)
}

/// Ends the process's context epoch (a context destroyed, or its image
/// replaced); returns the epoch that ended, 0 when there was no room to
/// record it.
#[inline(always)]
pub(crate) fn end_context_epoch(tgid: u32) -> u32 {
    let first = FIRST_CONTEXT_EPOCH as u64;
    let _ = CONTEXT_EPOCH.insert(&tgid, &first, BPF_NOEXIST as u64);
    let Some(epoch) = CONTEXT_EPOCH.get_ptr_mut(&tgid) else {
        count(stat::DROP_CONTEXT_EPOCH_FULL);
        return 0;
    };
    fetch_add(epoch, 1) as u32
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

/// Whether a block went away without a free: its image was replaced
/// (exec; userspace took it off the totals then), or the CUDA context
/// that owned it was destroyed (its epoch's totals are frozen, and
/// userspace counts them as released).
#[inline(always)]
fn released_without_free(tgid: u32, block: &LiveAlloc) -> bool {
    unsafe { EXEC_TIME.get(&tgid) }.is_some_and(|&exec_ns| block.timestamp_ns < exec_ns)
        || context_destroyed(tgid, block)
}

/// Removes a live block and takes it off its stack's totals.
#[inline(always)]
pub(crate) fn retire(key: &LiveKey, block: &LiveAlloc) {
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
