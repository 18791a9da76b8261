//! Where a new block's stack comes from: the kernel's frame-pointer walk
//! (STACKS), or, for processes unwound with DWARF (`--unwind dwarf`, or
//! `auto` for a process with code lacking frame pointers), a copy of the
//! top of the user stack that userspace unwinds from `.eh_frame`.
//!
//! A copied-stack block is counted by userspace, not in BY_STACK: its copy
//! record carries its size, and when it leaves the live set a free record
//! follows in the same ring buffer. The ring hands records out in the order
//! they were reserved, and a block's copy is reserved before its LIVE entry
//! exists, so its free can never come first. A free that finds the ring
//! full is not lost: it goes to COPY_FREES, a map with room for every live
//! block, which userspace reads after the ring at each drain.
use aya_ebpf::{
    EbpfContext,
    bindings::{
        BPF_F_NO_PREALLOC, BPF_F_USER_STACK, BPF_NOEXIST, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP,
        BPF_RB_NO_WAKEUP, BPF_RB_RING_SIZE,
    },
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_current_task_btf, bpf_probe_read_kernel,
        bpf_task_pt_regs,
        generated::{self, bpf_get_stack, bpf_probe_read_user},
    },
    macros::map,
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::{ProbeContext, RetProbeContext},
};
use tracer_ebpf::{
    COPIED_STACK, COPIED_STACK_MASK, CopyRef, GoStackSwitch, MAX_GO_SLOT, MAX_GOROUTINE_BYTES,
    MAX_STACK_FRAMES, MAX_STACK_PAGES, NO_STACK, PYTHON_FRAME_TAG, STACK_PAGE_BYTES, StackCopy,
    StackFrames, StackFree, stack_record, stat, unwind_walk::Registers,
};

use crate::counters::{atomic_add, count, count_by, fetch_add};

/// 0: every stack is walked by frame pointers; 1: every stack is copied;
/// 2: stacks of the processes in COPY_STACKS_OF are copied.
#[unsafe(no_mangle)]
static STACK_COPY_MODE: aya_ebpf::Global<u32> = aya_ebpf::Global::new(0);
/// Stack pages per copy (`--stack-bytes`), from the stack pointer's page.
#[unsafe(no_mangle)]
static STACK_PAGES: aya_ebpf::Global<u32> = aya_ebpf::Global::new(4);

/// 1 when the kernel has `bpf_loop` (Linux 5.17+), which the search for
/// asmcgocall's frame needs; 0 leaves that code out at load (a constant
/// to the verifier), and Go programs' C stacks end at asmcgocall.
#[unsafe(no_mangle)]
static GO_STACK_SEARCH: aya_ebpf::Global<u32> = aya_ebpf::Global::new(0);

/// Most distinct frame-pointer stacks (`--max-stacks`), set by userspace.
#[unsafe(no_mangle)]
static MAX_STACKS: aya_ebpf::Global<u32> = aya_ebpf::Global::new(1 << 17);

/// The frames of each frame-pointer stack, by id. Entries are made on
/// first use (no preallocation): a table sized for many stacks costs
/// kernel memory only for the stacks seen. An id is never reused or
/// overwritten, so a live block's stack never changes.
#[map]
static STACKS: HashMap<u32, StackFrames> = HashMap::with_max_entries(1 << 17, BPF_F_NO_PREALLOC);

/// The id of each distinct stack, by a 64-bit hash of its frames. Unlike
/// the kernel's stack-trace map, which refuses a stack whose bucket holds
/// another, distinct stacks never collide below capacity (a 64-bit hash
/// collision is ~1e-10 likely with 10^5 stacks).
#[map]
static STACK_IDS: HashMap<u64, u32> = HashMap::with_max_entries(1 << 17, 0);

/// The next frame-pointer stack id.
#[map]
static NEXT_STACK_ID: Array<u64> = Array::with_max_entries(1, 0);

/// Per CPU, where a stack is walked before it is looked up.
#[map]
static STACK_SCRATCH: PerCpuArray<StackFrames> = PerCpuArray::with_max_entries(1, 0);

/// Processes whose stacks are copied (`--unwind auto`), set by userspace.
#[map]
static COPY_STACKS_OF: HashMap<u32, u32> = HashMap::with_max_entries(4096, 0);

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

/// The stack of a block made by the call returning now, for its LIVE
/// entry: a STACKS id, a copied-stack reference, or `NO_STACK`.
#[inline(always)]
pub(crate) fn capture(
    ctx: &RetProbeContext,
    return_address: u64,
    size: u64,
    kind: u32,
    api: u32,
    context_epoch: u32,
) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let copies = copies_stacks_of(tgid);
    let python = crate::python::current_stack();
    if copies {
        let regs = unsafe { &*ctx.regs };
        let block = Block {
            record: stack_record::COPY,
            tgid,
            size,
            kind,
            api,
            context_epoch,
            python: python.unwrap_or(0),
        };
        // The return address read at entry, when there is one: the
        // instruction pointer a uprobe session's return program sees can
        // be the uprobe trampoline's.
        let ip = if return_address != 0 {
            return_address
        } else {
            regs.rip
        };
        if let Some(stack_ref) = copy_stack(&block, ip, regs.rsp, regs.rbp) {
            return stack_ref;
        }
    }
    let regs = unsafe { &*ctx.regs };
    let start = Registers {
        ip: if return_address != 0 {
            return_address
        } else {
            regs.rip
        },
        sp: regs.rsp,
        bp: regs.rbp,
    };
    walk_stack(ctx, tgid, python, Some(start))
}

/// The return address of the call entered now (the word at the stack
/// pointer: tracer's entry sites never move it) when the stacks of the
/// current process are copied; 0 otherwise.
#[inline(always)]
pub(crate) fn return_address_at_entry(ctx: &ProbeContext) -> u64 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !copies_stacks_of(tgid) && !crate::unwind::walks(tgid) {
        return 0;
    }
    let sp = unsafe { (*ctx.regs).rsp };
    unsafe { aya_ebpf::helpers::bpf_probe_read_user(sp as *const u64) }.unwrap_or(0)
}

/// Whether the stacks of `tgid` are copied.
#[inline(always)]
fn copies_stacks_of(tgid: u32) -> bool {
    match STACK_COPY_MODE.load() {
        0 => false,
        1 => true,
        _ => unsafe { COPY_STACKS_OF.get(&tgid) }.is_some(),
    }
}

/// At a system call of `tgid` (the mapping tracepoints): a copy of the
/// user stack where the call was made, as a `stack_record::MAPPING_COPY`;
/// None when this process's stacks are walked by frame pointers or the
/// ring is full.
#[inline(always)]
pub(crate) fn copy_at_syscall(tgid: u32) -> Option<u32> {
    if !copies_stacks_of(tgid) {
        return None;
    }
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const u64;
    let read = |index: usize| unsafe { bpf_probe_read_kernel(regs.add(index)) }.ok();
    let (ip, sp, bp) = (
        read(PT_REGS_IP_INDEX)?,
        read(PT_REGS_SP_INDEX)?,
        read(PT_REGS_BP_INDEX)?,
    );
    let call = Block {
        record: stack_record::MAPPING_COPY,
        tgid,
        size: 0,
        kind: 0,
        api: u32::MAX,
        context_epoch: 0,
        python: crate::python::current_stack().unwrap_or(0),
    };
    copy_stack(&call, ip, sp, bp)
}

/// At a system call of `tgid` (the mapping tracepoints): the id of its
/// user stack walked through the unwind tables from the registers where
/// the call was made; None when the process has none.
#[inline(always)]
pub(crate) fn walk_at_syscall(ctx: &impl EbpfContext, tgid: u32) -> Option<u32> {
    if !crate::unwind::walks(tgid) {
        return None;
    }
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const u64;
    let read = |index: usize| unsafe { bpf_probe_read_kernel(regs.add(index)) }.ok();
    let start = Registers {
        ip: read(PT_REGS_IP_INDEX)?,
        sp: read(PT_REGS_SP_INDEX)?,
        bp: read(PT_REGS_BP_INDEX)?,
    };
    Some(walk_stack(
        ctx,
        tgid,
        crate::python::current_stack(),
        Some(start),
    ))
}

/// Indices of rbp, rip and rsp in the kernel's `struct pt_regs` (x86-64,
/// the ptrace register layout).
const PT_REGS_BP_INDEX: usize = 4;
const PT_REGS_IP_INDEX: usize = 16;
pub(crate) const PT_REGS_SP_INDEX: usize = 19;

/// What a copy record says besides the stack.
#[repr(C)]
pub struct Block {
    record: u32,
    tgid: u32,
    size: u64,
    kind: u32,
    api: u32,
    context_epoch: u32,
    /// The Python stack's id (`python.rs`), 0 for none.
    python: u32,
}

/// The kernel's frame-pointer walk of the user stack: the id of that
/// stack in STACKS, stored on its first walk.
#[inline(always)]
pub(crate) fn walk_frame_pointers(ctx: &impl EbpfContext) -> u32 {
    walk_stack(ctx, 0, crate::python::current_stack(), None)
}

/// The id of the user stack: walked from `start` through the unwind
/// tables of `tgid` (`unwind.rs`) when it has them, by frame pointers
/// otherwise, with the current Python stack (`python.rs`) walked already:
/// its id becomes the stack's last frame.
#[inline(always)]
fn walk_stack(
    ctx: &impl EbpfContext,
    tgid: u32,
    python: Option<u32>,
    start: Option<Registers>,
) -> u32 {
    let Some(scratch) = STACK_SCRATCH.get_ptr_mut(0) else {
        count(stat::DROP_STACK_ERROR);
        return NO_STACK;
    };
    // Python frames (python.rs): their stack's id is the last frame.
    let room = if python.is_some() {
        MAX_STACK_FRAMES - 1
    } else {
        MAX_STACK_FRAMES
    };
    let walked = start.is_some_and(|start| {
        crate::unwind::tracer_unwind_walk(tgid, start.ip, start.sp, start.bp, room as u64) != 0
    });
    if !walked {
        // Masked so the verifier sees the size bounded by the scratch value.
        let size = (room * 8) as u32 & (size_of::<StackFrames>() as u32 - 1);
        let bytes =
            unsafe { bpf_get_stack(ctx.as_ptr(), scratch.cast(), size, BPF_F_USER_STACK as u64) };
        if bytes <= 0 {
            count(stat::DROP_STACK_ERROR);
            return NO_STACK;
        }
        let stack = unsafe { &mut *scratch };
        stack.count = (bytes as u64 / 8).min(room as u64);
    }
    tracer_store_stack(python.map_or(-1, i64::from))
}

/// The id of the stack in the scratch, with the Python stack `python`
/// (-1 for none) as its last frame: looked up, or stored. A global
/// function, verified once per program (see `tracer_unwind_walk`).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn tracer_store_stack(python: i64) -> u32 {
    let Some(scratch) = STACK_SCRATCH.get_ptr_mut(0) else {
        count(stat::DROP_STACK_ERROR);
        return NO_STACK;
    };
    let stack = unsafe { &mut *scratch };
    if python >= 0 {
        let id = python as u32;
        let index = stack.count as usize;
        if index < MAX_STACK_FRAMES {
            stack.frames[index] = PYTHON_FRAME_TAG | id as u64;
            stack.count += 1;
        }
    }
    let hash = stack.hash();
    if let Some(&id) = unsafe { STACK_IDS.get(&hash) } {
        return id;
    }
    store_stack(hash, stack)
}

/// The per-CPU stack scratch (`walk_stack`'s).
#[inline(always)]
pub(crate) fn scratch() -> Option<*mut StackFrames> {
    STACK_SCRATCH.get_ptr_mut(0)
}

/// Hands a new stack an id and stores its frames.
#[inline(never)]
fn store_stack(hash: u64, stack: &StackFrames) -> u32 {
    let Some(next) = NEXT_STACK_ID.get_ptr_mut(0) else {
        count(stat::DROP_STACK_ERROR);
        return NO_STACK;
    };
    let id = fetch_add(next, 1);
    if id >= MAX_STACKS.load() as u64 {
        count(stat::DROP_STACK_TABLE_FULL);
        return NO_STACK;
    }
    let id = id as u32;
    if STACKS.insert(&id, stack, BPF_NOEXIST as u64).is_err() {
        count(stat::DROP_STACK_ERROR);
        return NO_STACK;
    }
    if STACK_IDS.insert(&hash, &id, BPF_NOEXIST as u64).is_ok() {
        return id;
    }
    // Another CPU stored the same stack first: use its id.
    let _ = STACKS.remove(&id);
    match unsafe { STACK_IDS.get(&hash) } {
        Some(&first) => first,
        None => {
            count(stat::DROP_STACK_TABLE_FULL);
            NO_STACK
        }
    }
}

#[inline(always)]
fn copy_stack(block: &Block, ip: u64, sp: u64, bp: u64) -> Option<u32> {
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
    if !copies_stacks_of(tgid) {
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
