//! The live set, shared by every program that allocates or frees: LIVE
//! keeps one entry per outstanding block seen since attach, BY_STACK the
//! totals per (process, stack, kind, context epoch) that userspace
//! snapshots, updated here with atomic adds.
//!
//! A block can also go away without a free: its image was replaced (exec,
//! EXEC_TIME) or the CUDA context that owned it was destroyed
//! (CONTEXT_EPOCH; see `gpu.rs`). Such a block is no longer counted, so
//! `take_live` and `put_live` take it out of LIVE and leave the totals
//! alone (`retire`). At an exec, `replace_image` zeroes the process's live
//! totals in the kernel, before the new image runs: what the old image
//! held is gone, and every block of the new one counts from zero. free's
//! `free_live` asks only about the image (LAST_EXEC_NS spares the lookup
//! for blocks newer than every exec).
//!
//! Copied-stack blocks (`--unwind copy`) are counted by userspace instead
//! of in BY_STACK: their removals are sent to it as free records (through
//! the ring, or COPY_FREES when it is full; see `stacks.rs`), an exec as
//! one record after the old image's last.
use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST},
    helpers::generated,
    macros::map,
    maps::{Array, HashMap},
};
use tracer_ebpf::{
    ByStackKey, FIRST_CONTEXT_EPOCH, LiveAlloc, LiveKey, StackTotals, is_copied_stack,
    stack_record, stat,
};

use crate::{
    counters::{atomic_add, atomic_sub, compare_exchange, count, fetch_add},
    stacks::{send_exec, send_free},
};

/// Every outstanding block seen since attach. Preallocated: 117 MB of
/// kernel memory at 1 M entries, made in about 50 ms at attach on a quiet
/// machine (more when memory must be reclaimed first). With
/// `BPF_F_NO_PREALLOC` the attach's maps phase was 15-40 ms shorter, but
/// each insert and delete took an element from the kernel's allocator:
/// with 200 k blocks live a traced malloc cost 1.2-1.7 µs more and a free
/// 1.2-1.4 µs more (+30 % and +80 %; issue 28's measurement).
#[map]
static LIVE: HashMap<LiveKey, LiveAlloc> = HashMap::with_max_entries(1 << 20, 0);

/// Totals per (process, stack, kind): what userspace snapshots. Entries
/// are made on a stack's first block (no preallocation): sized for many
/// stacks, the table costs kernel memory only for those seen.
#[map]
static BY_STACK: HashMap<ByStackKey, StackTotals> =
    HashMap::with_max_entries(1 << 19, BPF_F_NO_PREALLOC);

/// When each traced process last exec'ed (ktime ns, set by
/// `libraries.rs`): older blocks belonged to an image that is gone.
#[map]
static EXEC_TIME: HashMap<u32, u64> = HashMap::with_max_entries(4096, 0);

/// The latest exec of any traced process (ktime ns): a block allocated
/// since then belongs to a live image, whatever its process, and free
/// does not look EXEC_TIME up.
#[map]
static LAST_EXEC_NS: Array<u64> = Array::with_max_entries(1, 0);

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
pub(crate) fn stack_key(tgid: u32, block: &LiveAlloc) -> ByStackKey {
    ByStackKey {
        tgid,
        stack_id: block.stack_id,
        kind: block.kind,
        context_epoch: block.context_epoch,
    }
}

/// A stack's totals, created on first use; None when BY_STACK is full.
#[inline(always)]
fn totals_of(key: &ByStackKey) -> Option<*mut StackTotals> {
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

/// `tgid` replaced its image (execve) at `exec_ns`, before the new image
/// runs (every other thread of the old one is gone): the old image's
/// blocks are taken off at once, the totals of its stacks no context owns
/// zeroed (the CUDA context-owned ones are released by the end of the
/// context epoch, which the exec also ends); userspace, which keeps the
/// copied stacks' totals, is told in their ring. Its blocks stay in LIVE and
/// are retired without counting when they are found (an address reused,
/// a free of the new image at the same address).
#[inline(always)]
pub(crate) fn replace_image(tgid: u32, exec_ns: u64) {
    let _ = EXEC_TIME.insert(&tgid, &exec_ns, 0);
    raise_last_exec(exec_ns);
    let mut target = tgid;
    unsafe {
        generated::bpf_for_each_map_elem(
            (&raw const BY_STACK).cast_mut().cast(),
            zero_live_of as *mut _,
            (&raw mut target).cast(),
            0,
        )
    };
    send_exec(tgid);
}

/// LAST_EXEC_NS = max(LAST_EXEC_NS, `exec_ns`): two execs at once on two
/// CPUs never leave the older time.
#[inline(always)]
fn raise_last_exec(exec_ns: u64) {
    let Some(last) = LAST_EXEC_NS.get_ptr_mut(0) else {
        return;
    };
    let mut seen = unsafe { core::ptr::read_volatile(last) };
    // Another exec can only move it up: a few tries always settle it.
    for _ in 0..4 {
        if seen >= exec_ns {
            return;
        }
        match compare_exchange(last, seen, exec_ns) {
            Ok(()) => return,
            Err(now) => seen = now,
        }
    }
}

/// One BY_STACK entry: zeroes the live totals of the exec'ed process's
/// stacks that no CUDA context owns. A callback of
/// `bpf_for_each_map_elem` (Linux 5.13+): 0 goes on.
extern "C" fn zero_live_of(
    _map: *mut core::ffi::c_void,
    key: *const ByStackKey,
    totals: *mut StackTotals,
    tgid: *mut u32,
) -> i64 {
    unsafe {
        if (*key).tgid == *tgid && (*key).context_epoch == 0 {
            (*totals).live_bytes = 0;
            (*totals).live_allocs = 0;
        }
    }
    0
}

/// Whether a block belongs to an image its process replaced since (exec;
/// its totals were zeroed then).
#[inline(always)]
fn of_replaced_image(tgid: u32, block: &LiveAlloc) -> bool {
    let last_exec_ns = LAST_EXEC_NS.get(0).copied().unwrap_or(0);
    block.timestamp_ns < last_exec_ns
        && unsafe { EXEC_TIME.get(&tgid) }.is_some_and(|&exec_ns| block.timestamp_ns < exec_ns)
}

/// Whether a block went away without a free: its image was replaced
/// (exec), or the CUDA context that owned it was destroyed (its epoch's
/// totals are frozen, and userspace counts them as released).
#[inline(always)]
fn released_without_free(tgid: u32, block: &LiveAlloc) -> bool {
    of_replaced_image(tgid, block) || context_destroyed(tgid, block)
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
/// totals (free's way: one lookup, and a look at the image only for a
/// block older than the latest exec); returns whether it counted. A
/// block of a replaced image is counted in `frees_of_replaced_image`
/// (its address freed again by the new image, which allocated it unseen).
#[inline(always)]
pub(crate) fn free_live(key: &LiveKey, block: &LiveAlloc) -> bool {
    let _ = LIVE.remove(key);
    if of_replaced_image(key.tgid, block) {
        count(stat::FREES_OF_REPLACED_IMAGE);
        return false;
    }
    remove_from_stack(key.tgid, block);
    true
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
