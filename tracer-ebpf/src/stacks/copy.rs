//! Copies of the top of the user stack, for processes unwound with DWARF
//! in userspace: the copy records in STACK_COPIES, with a cgo program's
//! goroutine stack above its system stack, and the free and restore
//! records of copied-stack blocks.
//!
//! A copied-stack block is counted by userspace, not in BY_STACK: its copy
//! record carries its size, and when it leaves the live set a free record
//! follows in the same ring buffer. The ring hands records out in the order
//! they were reserved, and a block's copy is reserved before its LIVE entry
//! exists, so its free can never come first. A free that finds the ring
//! full is not lost: it goes to COPY_FREES, a map with room for every live
//! block, which userspace reads after the ring at each drain.
use aya_ebpf::{
    bindings::{
        BPF_F_NO_PREALLOC, BPF_NOEXIST, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP,
        BPF_RB_RING_SIZE,
    },
    helpers::generated::{self, bpf_probe_read_user},
    macros::map,
    maps::{Array, HashMap, RingBuf},
};
use tracer_ebpf::{
    COPIED_STACK, COPIED_STACK_MASK, CopyRef, GoStackSwitch, MAX_GO_SLOT, MAX_GOROUTINE_BYTES,
    MAX_STACK_PAGES, STACK_PAGE_BYTES, StackCopy, StackFree, stack_record, stat,
};

use super::Block;
use crate::counters::{atomic_add, count, count_by, fetch_add};

/// Stack pages per copy (`--stack-bytes`), from the stack pointer's page.
#[unsafe(no_mangle)]
static STACK_PAGES: aya_ebpf::Global<u32> = aya_ebpf::Global::new(4);

/// 1 when the kernel has `bpf_loop` (Linux 5.17+), which the search for
/// asmcgocall's frame needs; 0 leaves that code out at load (a constant
/// to the verifier), and Go programs' C stacks end at asmcgocall.
#[unsafe(no_mangle)]
static GO_STACK_SEARCH: aya_ebpf::Global<u32> = aya_ebpf::Global::new(0);

/// Go programs that call C (cgo): how their `runtime.asmcgocall`
/// switches to the system stack, by process, set by userspace. A copy of
/// such a process's stack also holds the goroutine's stack above the
/// switch.
#[map]
static GO_STACK_SWITCHES: HashMap<u32, GoStackSwitch> = HashMap::with_max_entries(4096, 0);

/// Copy, free and restore records, drained by userspace on a timer.
#[map]
static STACK_COPIES: RingBuf = RingBuf::with_byte_size(16 << 20, 0);

/// Frees and restores of copied-stack blocks that found STACK_COPIES full:
/// per block, frees minus restores. Sized like LIVE by userspace (a block
/// can only be freed while it is in LIVE), with entries made on use.
#[map]
static COPY_FREES: HashMap<CopyRef, i64> = HashMap::with_max_entries(1 << 20, BPF_F_NO_PREALLOC);

/// How many entries were ever made in COPY_FREES: userspace walks the map
/// only when this moved (a walk of an empty hash map visits every bucket).
#[map]
static COPY_FREES_MADE: Array<u64> = Array::with_max_entries(1, 0);

/// The next copied-stack reference.
#[map]
static NEXT_COPY: Array<u64> = Array::with_max_entries(1, 0);

const HEADER_BYTES: usize = size_of::<StackCopy>();

#[inline(always)]
pub(super) fn copy_stack(block: &Block, ip: u64, sp: u64, bp: u64) -> Option<u32> {
    match tracer_copy_stack(block, ip, sp, bp) {
        -1 => None,
        stack_ref => Some(stack_ref as u32),
    }
}

/// A copy of the user stack at `sp` into STACK_COPIES with `block`'s
/// record: its reference, or -1 when none was made. A global function,
/// verified once per program (see `tracer_unwind_walk`).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn tracer_copy_stack(block: *const Block, ip: u64, sp: u64, bp: u64) -> i64 {
    if block.is_null() {
        return -1;
    }
    match copy_stack_inline(unsafe { &*block }, ip, sp, bp) {
        Some(stack_ref) => stack_ref as i64,
        None => -1,
    }
}

#[inline(always)]
fn copy_stack_inline(block: &Block, ip: u64, sp: u64, bp: u64) -> Option<u32> {
    let pages = STACK_PAGES.load().min(MAX_STACK_PAGES);
    let pages_bytes = pages as usize * STACK_PAGE_BYTES as usize;
    let go = if GO_STACK_SEARCH.load() != 0 {
        unsafe { GO_STACK_SWITCHES.get(&block.tgid) }
    } else {
        None
    };
    // Two calls: the size of a reservation must be a constant.
    let reserved = if go.is_some() {
        STACK_COPIES.reserve_bytes(HEADER_BYTES + pages_bytes + MAX_GOROUTINE_BYTES as usize, 0)
    } else {
        STACK_COPIES.reserve_bytes(HEADER_BYTES + pages_bytes, 0)
    };
    let Some(mut record) = reserved else {
        count(stat::DROP_STACK_COPY_RING_FULL);
        return None;
    };
    let Some(next) = NEXT_COPY.get_ptr_mut(0) else {
        record.discard(0);
        return None;
    };
    let sequence = fetch_add(next, 1);
    let stack_ref = COPIED_STACK | (sequence as u32 & COPIED_STACK_MASK);
    let base = sp & !(STACK_PAGE_BYTES - 1);
    let data = record.as_mut_ptr();
    let mut length = 0u64;
    let mut reached_top = 0;
    for page in 0..MAX_STACK_PAGES {
        if page >= pages {
            break;
        }
        let offset = page as u64 * STACK_PAGE_BYTES;
        let read = unsafe {
            bpf_probe_read_user(
                data.add(HEADER_BYTES + offset as usize).cast(),
                STACK_PAGE_BYTES as u32,
                (base + offset) as *const _,
            )
        };
        if read != 0 {
            reached_top = 1;
            break;
        }
        length += STACK_PAGE_BYTES;
    }
    let header = StackCopy {
        record: block.record,
        tgid: block.tgid,
        stack_ref,
        kind: block.kind,
        api: block.api,
        reached_top,
        context_epoch: block.context_epoch,
        python_stack: block.python,
        size: block.size,
        ip,
        sp,
        bp,
        base,
        length,
        switch_at: 0,
        goroutine_sp: 0,
        goroutine_length: 0,
    };
    let header_at = data.cast::<StackCopy>();
    unsafe { core::ptr::write_unaligned(header_at, header) };
    if let Some(switch) = go {
        // The length read back from the header: one value the verifier
        // does not know, rather than one known value per page the copy
        // may have stopped at, each checked on its own through what
        // follows.
        let length = unsafe { core::ptr::read_volatile(&raw const (*header_at).length) };
        let goroutine = copy_goroutine_stack(switch, data, base, sp - base, length, pages_bytes);
        unsafe {
            core::ptr::write_volatile(&raw mut (*header_at).switch_at, goroutine.switch_at);
            core::ptr::write_volatile(&raw mut (*header_at).goroutine_sp, goroutine.sp);
            core::ptr::write_volatile(&raw mut (*header_at).goroutine_length, goroutine.length);
        }
    }
    record.submit(wakeup_flag());
    count(stat::STACK_COPIES);
    Some(stack_ref)
}

/// Where a copy's goroutine stack came from (all 0: none).
#[derive(Default)]
struct GoroutineStack {
    switch_at: u64,
    sp: u64,
    length: u64,
}

/// Candidate frames searched for asmcgocall's switch: 16 KiB of stack.
const MAX_SWITCH_SLOTS: u32 = 1024;

/// The state of the search for asmcgocall's frame (`bpf_loop`).
#[repr(C)]
struct SwitchSearch {
    data: *mut u8,
    /// Offset of the first candidate return address in the copy.
    first: u64,
    length: u64,
    return_address: u64,
    /// Where it was found; `u64::MAX` while not.
    found_at: u64,
}

/// One candidate of the search: 0 to go on, 1 to stop. A callback of
/// `bpf_loop` (Linux 5.17+), so the verifier checks it once, not once per
/// candidate (a plain loop tripled the programs' load time).
extern "C" fn find_switch_step(index: u64, search: *mut SwitchSearch) -> i64 {
    let search = unsafe { &mut *search };
    let pages_bytes = (STACK_PAGES.load().min(MAX_STACK_PAGES) as u64) * STACK_PAGE_BYTES;
    // Masked so the verifier sees the offset bounded before the checks
    // below: `first` is within the first page, index below the count.
    let at = (search.first & 0x1fff) + (index & (MAX_SWITCH_SLOTS as u64 - 1)) * 16;
    // The slots read lie in the copied bytes (and, for the verifier, in
    // the record).
    if at + 16 + MAX_GO_SLOT as u64 > pages_bytes || at + 16 + MAX_GO_SLOT as u64 > search.length {
        return 1;
    }
    let word =
        unsafe { core::ptr::read(search.data.add(HEADER_BYTES + at as usize).cast::<u64>()) };
    if word == search.return_address {
        search.found_at = at;
        return 1;
    }
    0
}

/// Finds, in the system-stack bytes just copied to `data` (after the
/// header; the stack pointer at `sp_offset`), the frame where asmcgocall
/// called into C, and copies the goroutine's stack above it after them.
///
/// The frame is found by its return address: the call's CFA is 16-byte
/// aligned (asmcgocall aligns the stack for the C ABI), so the return
/// address sits 8 bytes below a 16-byte boundary. Userspace checks that
/// the frame found is the one its unwinding reaches.
#[inline(always)]
fn copy_goroutine_stack(
    switch: &GoStackSwitch,
    data: *mut u8,
    base: u64,
    sp_offset: u64,
    length: u64,
    pages_bytes: usize,
) -> GoroutineStack {
    let g_slot = switch.g_slot & MAX_GO_SLOT;
    let depth_slot = switch.depth_slot & MAX_GO_SLOT;
    let mut search = SwitchSearch {
        data,
        first: ((sp_offset + 7) & !15) + 8,
        length,
        return_address: switch.return_address,
        found_at: u64::MAX,
    };
    unsafe {
        generated::bpf_loop(
            MAX_SWITCH_SLOTS,
            find_switch_step as *mut _,
            (&raw mut search).cast(),
            0,
        )
    };
    let at = search.found_at;
    if at > (pages_bytes - 16 - MAX_GO_SLOT as usize) as u64 {
        return GoroutineStack::default();
    }
    let word = |offset: u64| unsafe {
        core::ptr::read(data.add(HEADER_BYTES + offset as usize).cast::<u64>())
    };
    let (g, depth) = (
        word(at + 8 + g_slot as u64),
        word(at + 8 + depth_slot as u64),
    );
    let Ok(stack_hi) = (unsafe {
        aya_ebpf::helpers::bpf_probe_read_user((g + switch.stack_hi as u64) as *const u64)
    }) else {
        return GoroutineStack::default();
    };
    if depth == 0 || depth > stack_hi {
        return GoroutineStack::default();
    }
    let sp = stack_hi - depth;
    let bytes = depth.min(MAX_GOROUTINE_BYTES);
    let length = length.min(pages_bytes as u64);
    let read = unsafe {
        bpf_probe_read_user(
            data.add(HEADER_BYTES + length as usize).cast(),
            bytes as u32,
            sp as *const _,
        )
    };
    if read != 0 {
        return GoroutineStack::default();
    }
    GoroutineStack {
        switch_at: base + at,
        sp,
        length: bytes,
    }
}

/// Userspace drains the ring on a timer, without being woken per record;
/// a burst that fills a quarter of the ring wakes it at once, so bursts
/// faster than the timer do not overflow it.
#[inline(always)]
fn wakeup_flag() -> u64 {
    let waiting = STACK_COPIES.query(BPF_RB_AVAIL_DATA as u64);
    if waiting > STACK_COPIES.query(BPF_RB_RING_SIZE as u64) / 4 {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

/// `tgid` replaced its image (exec): when its stacks are copied, tells
/// userspace in the ring, after every record of the old image (whose
/// threads are all gone), so that it drops the old image's blocks there.
#[inline(always)]
pub(crate) fn send_exec(tgid: u32) {
    if !super::copies_stacks_of(tgid) {
        return;
    }
    let exec = StackFree {
        record: stack_record::EXEC,
        tgid,
        stack_ref: 0,
        pad: 0,
    };
    if STACK_COPIES
        .output::<StackFree>(&exec, BPF_RB_FORCE_WAKEUP as u64)
        .is_err()
    {
        count(stat::DROP_EXEC_MARK_LOST);
    }
}

/// Tells userspace that the copied-stack block `stack_ref` of `size`
/// bytes left the live set (`stack_record::FREE`) or came back
/// (`stack_record::RESTORE`): through the ring, or, when it is full,
/// through COPY_FREES.
#[inline(always)]
pub(crate) fn send_free(tgid: u32, stack_ref: u32, size: u64, record: u32) {
    let free = StackFree {
        record,
        tgid,
        stack_ref,
        pad: 0,
    };
    if STACK_COPIES
        .output::<StackFree>(&free, wakeup_flag())
        .is_ok()
    {
        return;
    }
    let key = CopyRef { tgid, stack_ref };
    let change: i64 = if record == stack_record::FREE { 1 } else { -1 };
    if COPY_FREES.insert(&key, &change, BPF_NOEXIST as u64).is_ok() {
        if let Some(made) = COPY_FREES_MADE.get_ptr_mut(0) {
            atomic_add(made, 1);
        }
        count(stat::STACK_FREES_DEFERRED);
        return;
    }
    // Another record of this block waits there (a free, then its failed
    // realloc's restore), or the map is full.
    match COPY_FREES.get_ptr_mut(&key) {
        Some(waiting) => {
            atomic_add(waiting.cast(), change as u64);
            count(stat::STACK_FREES_DEFERRED);
        }
        None => {
            count(stat::DROP_STACK_FREE_LOST);
            if record == stack_record::FREE {
                count_by(stat::STACK_FREE_LOST_BYTES, size);
            }
        }
    }
}
