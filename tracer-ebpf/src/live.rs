//! The live set, shared by every program that allocates or frees: LIVE
//! keeps one entry per outstanding block seen since attach, BY_STACK the
//! totals per (process, stack, kind, context epoch) that userspace
//! snapshots, updated here with atomic adds.
//!
//! A block can also go away without a free: its image was replaced (exec,
//! EXEC_TIME) or the CUDA context that owned it was destroyed
//! (CONTEXT_EPOCH; see `gpu.rs`). Such a block is no longer counted, so
//! `take_live` and `put_live` take it out of LIVE and leave the totals
//! alone (`retire`). free's `free_live` does not ask.
//!
//! Copied-stack blocks (`--unwind dwarf`) are counted by userspace instead
//! of in BY_STACK: their removals are sent to it as free records (through
//! the ring, or COPY_FREES when it is full; see `stacks.rs`).
use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST},
    macros::map,
    maps::HashMap,
};
use tracer_ebpf::{
    FIRST_CONTEXT_EPOCH, LiveAlloc, LiveKey, StackKey, StackTotals, is_copied_stack, stack_record,
    stat,
};

use crate::{
    counters::{atomic_add, atomic_sub, count, fetch_add},
    stacks::send_free,
};

/// Every outstanding block seen since attach.
#[map]
static LIVE: HashMap<LiveKey, LiveAlloc> = HashMap::with_max_entries(1 << 20, 0);

/// Totals per (process, stack, kind): what userspace snapshots. Entries
/// are made on a stack's first block (no preallocation): sized for many
/// stacks, the table costs kernel memory only for those seen.
#[map]
static BY_STACK: HashMap<StackKey, StackTotals> =
    HashMap::with_max_entries(1 << 19, BPF_F_NO_PREALLOC);

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

#[inline(always)]
pub(crate) fn stack_key(tgid: u32, block: &LiveAlloc) -> StackKey {
    StackKey {
        tgid,
        stack_id: block.stack_id,
        kind: block.kind,
        context_epoch: block.context_epoch,
    }
}

/// A stack's totals, created on first use; None when BY_STACK is full.
#[inline(always)]
fn totals_of(key: &StackKey) -> Option<*mut StackTotals> {
    if let Some(totals) = BY_STACK.get_ptr_mut(key) {
        return Some(totals);
    }
    let _ = BY_STACK.insert(key, StackTotals::default(), BPF_NOEXIST as u64);
    let totals = BY_STACK.get_ptr_mut(key);
    if totals.is_none() {
        count(stat::DROP_BY_STACK_FULL);
    }
    totals
}

/// Adds a block that joins the live set to its stack's totals;
/// `allocated` also counts the call in the running totals. A copied
/// stack's totals are kept by userspace, from the block's copy record.
#[inline(always)]
pub(crate) fn add_to_stack(tgid: u32, block: &LiveAlloc, allocated: bool) {
    if is_copied_stack(block.stack_id) {
        return;
    }
    let Some(totals) = totals_of(&stack_key(tgid, block)) else {
        return;
    };
    unsafe {
        atomic_add(&raw mut (*totals).live_bytes, block.size);
        atomic_add(&raw mut (*totals).live_allocs, 1);
        if allocated {
            atomic_add(&raw mut (*totals).alloc_bytes, block.size);
            atomic_add(&raw mut (*totals).alloc_count, 1);
        }
    }
}

/// Takes a block that leaves the live set off its stack's totals; for a
/// copied stack, tells userspace.
#[inline(always)]
pub(crate) fn remove_from_stack(tgid: u32, block: &LiveAlloc) {
    if is_copied_stack(block.stack_id) {
        send_free(tgid, block.stack_id, block.size, stack_record::FREE);
        return;
    }
    let Some(totals) = totals_of(&stack_key(tgid, block)) else {
        return;
    };
    unsafe {
        atomic_sub(&raw mut (*totals).live_bytes, block.size);
        atomic_sub(&raw mut (*totals).live_allocs, 1);
    }
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

/// Takes a block that leaves LIVE off its stack's totals, unless it went
/// away without a free and no longer counts; returns whether it counted.
#[inline(always)]
fn retire(tgid: u32, block: &LiveAlloc) -> bool {
    if released_without_free(tgid, block) {
        return false;
    }
    remove_from_stack(tgid, block);
    true
}

#[inline(always)]
pub(crate) fn live_key(tgid: u32, address: u64) -> LiveKey {
    LiveKey {
        tgid,
        pad: 0,
        address,
    }
}

/// Takes a block out of the live set; returns what it held, unless it
/// no longer counted.
#[inline(always)]
pub(crate) fn take_live(tgid: u32, address: u64) -> Option<LiveAlloc> {
    let key = live_key(tgid, address);
    let block = unsafe { *LIVE.get(&key)? };
    let _ = LIVE.remove(&key);
    retire(tgid, &block).then_some(block)
}

/// The block at `key`, when it is in the live set.
#[inline(always)]
pub(crate) fn find_live(key: &LiveKey) -> Option<LiveAlloc> {
    unsafe { LIVE.get(key) }.copied()
}

/// Takes a block found at `key` out of the live set and off its stack's
/// totals (free's way: one lookup, without asking whether it still counts).
#[inline(always)]
pub(crate) fn free_live(key: &LiveKey, block: &LiveAlloc) {
    let _ = LIVE.remove(key);
    remove_from_stack(key.tgid, block);
}

/// Puts a block into the live set and adds it to its stack's totals;
/// `allocated` also counts the call in the running totals (false: a
/// failed realloc's old block, taken off at its entry, comes back).
#[inline(always)]
pub(crate) fn put_live(tgid: u32, address: u64, block: &LiveAlloc, allocated: bool) {
    let key = live_key(tgid, address);
    if let Some(stale) = LIVE.get_ptr_mut(&key) {
        // The block's free was not seen (made inside another allocator
        // call, or its image or CUDA context is gone): retire it before
        // reusing the address.
        unsafe {
            retire(tgid, &*stale);
            *stale = *block;
        }
    } else if LIVE.insert(&key, block, BPF_NOEXIST as u64).is_err() {
        count(stat::DROP_LIVE_FULL);
        if is_copied_stack(block.stack_id) {
            // Userspace counted the copy as live: take it off again.
            send_free(tgid, block.stack_id, block.size, stack_record::FREE);
            return;
        }
        // Keep the call in the running totals; the live figures stay
        // exact for every block that is tracked.
        if let Some(totals) = totals_of(&stack_key(tgid, block)) {
            unsafe {
                atomic_add(&raw mut (*totals).alloc_bytes, block.size);
                atomic_add(&raw mut (*totals).alloc_count, 1);
            }
        }
        return;
    }
    if !allocated && is_copied_stack(block.stack_id) {
        // A failed realloc's old block, taken off at its entry.
        send_free(tgid, block.stack_id, block.size, stack_record::RESTORE);
    }
    add_to_stack(tgid, block, allocated);
}
