//! The kernel's walk of a user stack through the unwind tables userspace
//! builds from each object's `.eh_frame` (`tracer_ebpf::unwind`): per
//! frame, the process's mapping that holds the return address, then the
//! row of its object's table for it (or, for objects that keep frame
//! pointers, JIT code and tables not built yet, the frame pointer), and
//! one or two reads of the stack. A `bpf_loop` callback steps one frame,
//! so the verifier checks it once however deep the stack is.
//!
//! What a frame's return address needs (frame pointers, or which row of
//! which table) is kept in a per-CPU step cache (STEP_CACHE) by process,
//! version of its mappings and address: stacks repeat their frames, so most
//! frames cost one lookup there instead of two binary searches through
//! map memory. The stack itself is read a page at a time into a per-CPU
//! window (STACK_WINDOW), from which most frames' return addresses and
//! saved rbp are taken without a read of their own.
//!
//! The decisions (searches, rules) are `tracer_ebpf::unwind_walk`'s,
//! tested on the host; this file only feeds them maps and user memory.
use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    helpers::{bpf_probe_read_user, generated},
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
};
use tracer_ebpf::{
    MAX_STACK_FRAMES, MAX_UNWIND_MAPPINGS, STEP_CACHE_ENTRIES, StackFrames, StepCacheEntry,
    UNWIND_PENDING_FRAME, UNWIND_ROW_SEARCH_STEPS, UnwindMappings, UnwindRow, UnwindTable,
    cfa_rule, mapping_unwind, stat, step_cache_owner, step_cache_slot,
    unwind_walk::{
        Bounds, Registers, Step, find_mapping, last_at_or_below, step_by_frame_pointer, step_by_row,
    },
};

use crate::counters::count;

/// 1 when userspace fills the unwind tables (`--unwind auto`, `dwarf`):
/// 0 leaves the walk out at load (a constant to the verifier).
#[unsafe(no_mangle)]
static UNWIND_TABLES_ON: aya_ebpf::Global<u32> = aya_ebpf::Global::new(0);

/// The rows of every table, each table a contiguous run sorted by pc.
/// Sized by userspace at load; mappable, so userspace writes rows through
/// memory rather than one system call per row.
#[map]
static UNWIND_ROWS: Array<UnwindRow> = Array::with_max_entries(1, BPF_F_MMAPABLE);

/// Where each table's rows are in UNWIND_ROWS.
#[map]
static UNWIND_TABLES: Array<UnwindTable> = Array::with_max_entries(1 << 14, 0);

/// Per process (tgid), its executable mappings and how each is unwound.
#[map]
static UNWIND_MAPPINGS: HashMap<u32, UnwindMappings> =
    HashMap::with_max_entries(4096, BPF_F_NO_PREALLOC);

/// `BPF_F_MMAPABLE` (not in aya-ebpf's bindings).
const BPF_F_MMAPABLE: u32 = 1 << 10;

/// A walk in progress, per CPU. In map memory, which the verifier does
/// not follow: every load is a value it knows nothing of, so the paths of
/// one step (and of each search halving) meet again at the next.
#[repr(C)]
#[derive(Clone, Copy)]
struct WalkState {
    regs: Registers,
    /// Frames in the stack so far, and the most it may hold.
    count: u64,
    room: u64,
    /// Whether a frame was walked by frame pointers for want of a table.
    pending: u64,
    mappings_full: u64,
    /// Whether a frame was outside every mapping known.
    outside: u64,
    lo: u32,
    hi: u32,
}

#[map]
static UNWIND_WALK: PerCpuArray<WalkState> = PerCpuArray::with_max_entries(1, 0);

/// Bytes of user stack the window holds (one page).
const WINDOW_BYTES: u64 = 4096;
const WINDOW_WORDS: usize = WINDOW_BYTES as usize / 8;

/// Per CPU, a copy of the user stack being walked: `bytes` bytes from the
/// user address `start` (0: nothing yet).
#[repr(C)]
struct StackWindow {
    start: u64,
    bytes: u64,
    words: [u64; WINDOW_WORDS],
}

#[map]
static STACK_WINDOW: PerCpuArray<StackWindow> = PerCpuArray::with_max_entries(1, 0);

/// Per CPU, the rows found for recent return addresses (`StepCacheEntry`).
#[map]
static STEP_CACHE: PerCpuArray<StepCacheEntry> =
    PerCpuArray::with_max_entries(STEP_CACHE_ENTRIES as u32, 0);

/// A search's bounds in the walk's map memory.
struct MapBounds(*mut WalkState);

impl Bounds for MapBounds {
    #[inline(always)]
    fn get(&self) -> (u32, u32) {
        unsafe {
            (
                core::ptr::read_volatile(&raw const (*self.0).lo),
                core::ptr::read_volatile(&raw const (*self.0).hi),
            )
        }
    }
    #[inline(always)]
    fn set(&mut self, lo: u32, hi: u32) {
        unsafe {
            core::ptr::write_volatile(&raw mut (*self.0).lo, lo);
            core::ptr::write_volatile(&raw mut (*self.0).hi, hi);
        }
    }
}

/// What the frame callback works on (on the caller's stack).
#[repr(C)]
struct Walk {
    stack: *mut StackFrames,
    mappings: *const UnwindMappings,
    state: *mut WalkState,
    /// The step cache's tag for this process and its mappings' version.
    owner: u64,
    window: *mut StackWindow,
}

/// Whether the stacks of `tgid` are walked through unwind tables.
#[inline(always)]
pub(crate) fn walks(tgid: u32) -> bool {
    UNWIND_TABLES_ON.load() != 0 && unsafe { UNWIND_MAPPINGS.get(&tgid) }.is_some()
}

/// [`walk`] into the stack scratch of `stacks.rs`, as a global function
/// with plain arguments: the kernel verifies it once per program, not
/// once for each path of the program that reaches it. 1 when walked.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn tracer_unwind_walk(tgid: u32, ip: u64, sp: u64, bp: u64, room: u64) -> i64 {
    let Some(stack) = crate::scratch::scratch() else {
        return 0;
    };
    let room = (room as usize).min(MAX_STACK_FRAMES);
    walk(tgid, Registers { ip, sp, bp }, stack, room) as i64
}

/// Walks the user stack of `tgid` from `regs` (at an allocator's return
/// or a system call) into `stack`, at most `room` frames; false when the
/// process has no unwind mappings (the caller walks frame pointers).
#[inline(always)]
fn walk(tgid: u32, regs: Registers, stack: *mut StackFrames, room: usize) -> bool {
    if UNWIND_TABLES_ON.load() == 0 {
        return false;
    }
    let Some(mappings) = (unsafe { UNWIND_MAPPINGS.get(&tgid) }) else {
        return false;
    };
    let Some(state) = UNWIND_WALK.get_ptr_mut(0) else {
        return false;
    };
    let Some(window) = STACK_WINDOW.get_ptr_mut(0) else {
        return false;
    };
    // The stack changed since the last walk.
    unsafe { core::ptr::write_volatile(&raw mut (*window).start, 0) };
    unsafe {
        (*stack).frames[0] = regs.ip;
        (*stack).count = 1;
        *state = WalkState {
            regs,
            count: 1,
            room: room as u64,
            pending: 0,
            mappings_full: 0,
            outside: 0,
            lo: 0,
            hi: 0,
        };
    }
    let mut walk = Walk {
        stack,
        mappings,
        state,
        owner: step_cache_owner(tgid, mappings.generation),
        window,
    };
    unsafe {
        generated::bpf_loop(
            MAX_STACK_FRAMES as u32,
            step_frame as *mut _,
            (&raw mut walk).cast(),
            0,
        )
    };
    count(stat::UNWIND_STACKS);
    let state = unsafe { &*state };
    if state.pending != 0 {
        count(stat::UNWIND_TABLE_PENDING);
        // The marker after the last frame (in place of it when the stack
        // is full): the report says which stacks came before a table.
        unsafe {
            let frames = (*stack).count;
            let index = if frames < room as u64 {
                frames
            } else {
                frames.saturating_sub(1)
            };
            if index < MAX_STACK_FRAMES as u64 {
                (*stack).frames[index as usize] = UNWIND_PENDING_FRAME;
                (*stack).count = index + 1;
            }
        }
    }
    if state.mappings_full != 0 {
        count(stat::UNWIND_MAPPINGS_FULL);
    }
    if state.outside != 0 {
        count(stat::UNWIND_OUTSIDE_MAPPINGS);
    }
    true
}

/// Reads one word of user memory.
#[inline(always)]
fn read_user(address: u64) -> Option<u64> {
    unsafe { bpf_probe_read_user(address as *const u64) }.ok()
}

/// A word of the user stack at `address`: from the window, or read into it
/// from the word below `address` on (where a saved rbp usually is: the
/// caller's return address is read first), one page at most, less where
/// the stack ends first.
#[inline(always)]
fn read_stack(window: *mut StackWindow, address: u64) -> Option<u64> {
    if address & 7 != 0 {
        return read_user(address);
    }
    let (start, bytes) = unsafe {
        (
            core::ptr::read_volatile(&raw const (*window).start),
            core::ptr::read_volatile(&raw const (*window).bytes),
        )
    };
    let offset = address.wrapping_sub(start);
    if start == 0 || offset >= bytes {
        let start = address.wrapping_sub(8);
        let words = unsafe { (*window).words.as_mut_ptr() };
        let mut bytes = WINDOW_BYTES;
        let mut read = unsafe {
            generated::bpf_probe_read_user(words.cast(), bytes as u32, start as *const _)
        };
        if read != 0 {
            // To the end of the page after `address`'s word.
            bytes = 4096 - (start & 4095);
            if bytes > WINDOW_BYTES {
                return read_user(address);
            }
            read = unsafe {
                generated::bpf_probe_read_user(words.cast(), bytes as u32, start as *const _)
            };
        }
        if read != 0 || bytes < 16 {
            unsafe { core::ptr::write_volatile(&raw mut (*window).start, 0) };
            return read_user(address);
        }
        unsafe {
            core::ptr::write_volatile(&raw mut (*window).start, start);
            core::ptr::write_volatile(&raw mut (*window).bytes, bytes);
        }
        return Some(unsafe { (*window).words[1] });
    }
    Some(unsafe { (*window).words[(offset / 8) as usize & (WINDOW_WORDS - 1)] })
}

/// One frame: 0 to go on, 1 when the stack is walked. A callback of
/// `bpf_loop` (Linux 5.17+).
extern "C" fn step_frame(_index: u64, walk: *mut Walk) -> i64 {
    let walk = unsafe { &*walk };
    let state = walk.state;
    let regs = unsafe { core::ptr::read_volatile(&raw const (*state).regs) };
    let step = step_of(walk, regs);
    let next = match step {
        Step::Caller(next) => next,
        Step::End => return 1,
        Step::Stop(reason) => {
            count(reason);
            return 1;
        }
    };
    let (frames, room) = unsafe {
        (
            core::ptr::read_volatile(&raw const (*state).count),
            core::ptr::read_volatile(&raw const (*state).room),
        )
    };
    if frames >= room || frames >= MAX_STACK_FRAMES as u64 {
        count(stat::UNWIND_STOP_DEPTH);
        return 1;
    }
    unsafe {
        (*walk.stack).frames[frames as usize] = next.ip;
        (*walk.stack).count = frames + 1;
        core::ptr::write_volatile(&raw mut (*state).count, frames + 1);
        core::ptr::write_volatile(&raw mut (*state).regs, next);
    }
    0
}

/// The caller of the frame at `regs`: by the row of its mapping's table
/// that applies (from the step cache, or looked up and cached), or by its
/// frame pointer.
#[inline(always)]
fn step_of(walk: &Walk, regs: Registers) -> Step {
    let address = regs.lookup_address();
    let slot = step_cache_slot(address, walk.owner) as u32;
    let cached = STEP_CACHE
        .get_ptr_mut(slot)
        .map(|entry| unsafe { core::ptr::read_volatile(entry) });
    let row = match cached {
        Some(entry) if entry.address == address && entry.owner == walk.owner => entry.row,
        _ => {
            let Some((row, cacheable)) = row_of(walk, address) else {
                return Step::Stop(stat::UNWIND_STOP_UNSUPPORTED);
            };
            if cacheable && let Some(entry) = STEP_CACHE.get_ptr_mut(slot) {
                unsafe {
                    core::ptr::write_volatile(
                        entry,
                        StepCacheEntry {
                            address,
                            owner: walk.owner,
                            row,
                        },
                    )
                };
            }
            row
        }
    };
    let read = |address| read_stack(walk.window, address);
    match row.rule {
        cfa_rule::PENDING => {
            unsafe { (*walk.state).pending = 1 };
            step_by_frame_pointer(regs, read)
        }
        _ => step_by_row(&row, regs, read),
    }
}

/// The row that applies at `address` (a lookup address): its mapping's
/// table's, or `NO_INFO` (frame pointers: the object keeps them, or no row
/// covers it), or `PENDING`, and whether it may be cached; None when the
/// table cannot be read. Outside every mapping the walk goes by frame
/// pointers too, and says so in its state: such rows are not cached.
#[inline(always)]
fn row_of(walk: &Walk, address: u64) -> Option<(UnwindRow, bool)> {
    const FRAME_POINTERS: UnwindRow = UnwindRow {
        pc: 0,
        cfa_offset: 0,
        rule: cfa_rule::NO_INFO,
        rbp_offset_words: 0,
    };
    let mappings = unsafe { &*walk.mappings };
    let mut bounds = MapBounds(walk.state);
    let Some(index) = find_mapping(&mut bounds, &mappings.mappings, mappings.count, address) else {
        // JIT or anonymous code, or past the mappings the table had room
        // for (`pad` set by userspace).
        unsafe {
            if mappings.pad != 0 {
                (*walk.state).mappings_full = 1;
            } else {
                (*walk.state).outside = 1;
            }
        }
        return Some((FRAME_POINTERS, false));
    };
    let mapping = &mappings.mappings[index & (MAX_UNWIND_MAPPINGS - 1)];
    match mapping.unwind {
        mapping_unwind::TABLE => {}
        mapping_unwind::PENDING => {
            let pending = UnwindRow {
                rule: cfa_rule::PENDING,
                ..FRAME_POINTERS
            };
            return Some((pending, true));
        }
        _ => return Some((FRAME_POINTERS, true)),
    }
    let table = UNWIND_TABLES.get(mapping.table)?;
    let (first_row, row_count) = (table.first_row, table.row_count);
    let pc = address.wrapping_sub(mapping.bias);
    if pc > u32::MAX as u64 {
        return Some((FRAME_POINTERS, true));
    }
    let found = last_at_or_below(
        &mut bounds,
        row_count,
        UNWIND_ROW_SEARCH_STEPS + 1,
        pc,
        |index| {
            UNWIND_ROWS
                .get(first_row.wrapping_add(index))
                .map(|row| row.pc as u64)
        },
    );
    match found.and_then(|index| UNWIND_ROWS.get(first_row.wrapping_add(index))) {
        Some(row) => Some((*row, true)),
        // Below the table's first row: no information.
        None => Some((FRAME_POINTERS, true)),
    }
}
