//! Unwind tables for the kernel's own walk of stacks without frame
//! pointers: compact rows built by userspace from each object's
//! `.eh_frame` / `.debug_frame`, one table per file, shared by every
//! process that maps it, and per process the sorted list of its
//! executable mappings with the table (or rule) each one uses.
//!
//! UNWIND_ROWS holds the rows of every table, each table a contiguous run
//! sorted by `pc`; UNWIND_MAPPINGS holds, per process, its mappings sorted
//! by start. Per frame the kernel searches the process's mappings for the
//! instruction pointer, then the mapping's table for the last row whose
//! `pc` is at or below `ip - bias`, and applies that row.

/// Most executable mappings one process's table lists (binary search
/// depth 10). A process with more gets the rest walked by frame pointers
/// and counts `stat::UNWIND_MAPPINGS_FULL`.
pub const MAX_UNWIND_MAPPINGS: usize = 1024;

/// Steps of the binary search over one table's rows: enough for 2^24 rows.
pub const UNWIND_ROW_SEARCH_STEPS: u32 = 24;

/// How a row finds the caller's frame: the CFA (the caller's stack pointer
/// after the return) and where the return address and the caller's rbp
/// are. The return address is always at CFA - 8 on x86-64.
pub mod cfa_rule {
    /// CFA = rsp + `cfa_offset`.
    pub const RSP: u8 = 1;
    /// CFA = rbp + `cfa_offset`.
    pub const RBP: u8 = 2;
    /// A PLT entry's DWARF expression: CFA = rsp + 8, plus 8 when
    /// `(ip & 15) >= 11` (after the entry's push).
    pub const PLT: u8 = 3;
    /// The outermost frame (the return address is undefined): the stack
    /// ends here, completely.
    pub const END: u8 = 4;
    /// A signal frame (augmentation `S`): the walk stops here with
    /// `stat::UNWIND_STOP_SIGNAL`.
    pub const SIGNAL: u8 = 5;
    /// A rule the kernel cannot follow (another DWARF expression, a
    /// register other than rsp/rbp, an offset that does not fit): the walk
    /// stops with `stat::UNWIND_STOP_UNSUPPORTED`.
    pub const UNSUPPORTED: u8 = 6;
    /// No unwind information covers this address (a gap between FDEs):
    /// the walk tries frame pointers for this frame.
    pub const NO_INFO: u8 = 7;
    /// Only in the step cache (`StepCacheEntry`): the address is in a
    /// mapping whose table is not built yet (`mapping_unwind::PENDING`):
    /// frame pointers, and the stack is marked.
    pub const PENDING: u8 = 8;
}

/// One row of an unwind table: the rule from `pc` up to the next row's `pc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindRow {
    /// First address the row covers, as an address in the object's own
    /// virtual address space (the ELF's `p_vaddr` numbering).
    pub pc: u32,
    /// Bytes added to the register of `rule` (RSP, RBP) to get the CFA.
    pub cfa_offset: u16,
    /// A [`cfa_rule`] value.
    pub rule: u8,
    /// Where the caller's rbp was saved, in 8-byte words from the CFA
    /// (e.g. -2: at CFA - 16); 0 when rbp keeps its value (same value or
    /// not saved by this frame).
    pub rbp_offset_words: i8,
}

/// How a mapping's frames are unwound.
pub mod mapping_unwind {
    /// By the table `table` (an index into UNWIND_TABLES).
    pub const TABLE: u32 = 1;
    /// By frame pointers (the object keeps them, or it is JIT code or
    /// anonymous memory without unwind information).
    pub const FRAME_POINTERS: u32 = 2;
    /// The object's table is not built yet: frame pointers for now, and the
    /// stack counts `stat::UNWIND_TABLE_PENDING` and ends in
    /// `UNWIND_PENDING_FRAME`.
    pub const PENDING: u32 = 3;
}

/// The frame the kernel's walk adds after the last one it found when any
/// frame of the stack was walked by frame pointers because its object's
/// table was not built yet (`mapping_unwind::PENDING`): not a return
/// address (user addresses stay below 2^47). Userspace shows it as a
/// marker frame; the same stack walked once the table is ready has no
/// such frame, so it is a stack of its own.
pub const UNWIND_PENDING_FRAME: u64 = 0xfd00_0000_0000_0000;

/// One executable mapping of a process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindMapping {
    pub start: u64,
    pub end: u64,
    /// Subtracted from an instruction pointer in the mapping to get the
    /// table's `pc` numbering: `start - offset_in_file - (p_vaddr - p_offset)`
    /// of the segment mapped.
    pub bias: u64,
    /// A [`mapping_unwind`] value.
    pub unwind: u32,
    /// Index into UNWIND_TABLES when `unwind` is `TABLE`.
    pub table: u32,
}

/// A process's executable mappings, sorted by `start`, not overlapping: a
/// value of UNWIND_MAPPINGS, keyed by tgid.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnwindMappings {
    /// How many of `mappings` are in use.
    pub count: u32,
    pub pad: u32,
    /// Different in every value userspace writes (from 1): the step
    /// cache's entries made under an older list no longer match.
    pub generation: u32,
    pub pad2: u32,
    pub mappings: [UnwindMapping; MAX_UNWIND_MAPPINGS],
}

impl Default for UnwindMappings {
    fn default() -> Self {
        UnwindMappings {
            count: 0,
            pad: 0,
            generation: 0,
            pad2: 0,
            mappings: [UnwindMapping::default(); MAX_UNWIND_MAPPINGS],
        }
    }
}

/// Entries of the per-CPU step cache (a power of two).
pub const STEP_CACHE_ENTRIES: usize = 1 << 13;

/// One entry of the per-CPU step cache: what the walk applies at a return
/// address of one process, under one version of its mappings, so that a
/// frame seen before costs one lookup instead of two binary searches
/// (its mapping, then its table's row). Exact: an entry is used only for
/// the same address, process and `UnwindMappings::generation`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepCacheEntry {
    /// The lookup address (return address - 1).
    pub address: u64,
    /// [`step_cache_owner`] of the process and its mappings' generation;
    /// 0 for an empty entry.
    pub owner: u64,
    /// The row that applies: a table's, or `cfa_rule::NO_INFO` (frame
    /// pointers), or `cfa_rule::PENDING`.
    pub row: UnwindRow,
}

/// The owner tag of step cache entries for `tgid` under mappings of
/// `generation` (never 0: generations start at 1).
#[inline(always)]
pub fn step_cache_owner(tgid: u32, generation: u32) -> u64 {
    ((tgid as u64) << 32) | generation as u64
}

/// The slot of the step cache for `address` and `owner`.
#[inline(always)]
pub fn step_cache_slot(address: u64, owner: u64) -> usize {
    let mixed =
        (address ^ owner.wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_mul(0xff51_afd7_ed55_8ccd);
    (mixed >> (64 - STEP_CACHE_ENTRIES.trailing_zeros())) as usize & (STEP_CACHE_ENTRIES - 1)
}

/// Where one table's rows lie in UNWIND_ROWS: a value of UNWIND_TABLES.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindTable {
    /// Index of the table's first row in UNWIND_ROWS.
    pub first_row: u32,
    /// How many rows follow (sorted by `pc`).
    pub row_count: u32,
}
