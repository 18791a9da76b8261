//! The kernel's unwind walk, written once in plain Rust: the specification
//! that tracer-ebpf's walker ports, and the host-side test of its
//! decisions (the same mappings, rows and tables, any memory).
//!
//! Per frame: find the mapping that holds the lookup address (binary
//! search by start), then, for a mapping with a table, the last row of
//! its table at or below `lookup - bias`; apply the row, or walk the frame
//! by its frame pointer where the mapping says so, where no mapping holds
//! the address (JIT code, anonymous memory) and where no row covers it
//! (NO_INFO). Return addresses point past their call, so every frame but
//! the first looks up `ip - 1`: a call that ends a function (to a
//! `noreturn` function) belongs to it, not to the next one.
//!
//! The first frame is taken as it is: a probe at a function's first
//! instruction in an object walked by frame pointers loses that
//! function's caller (rbp is still the caller's), as `bpf_get_stack`
//! does; rows have no such blind spot.
/// The registers a walk starts from: the eBPF walk's own type.
pub use tracer_ebpf::unwind_walk::Registers;
use tracer_ebpf::{UnwindMappings, UnwindRow, UnwindTable, cfa_rule, mapping_unwind};

/// Why a walk ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WalkEnd {
    /// The outermost frame (an END row: `_start`, a thread's clone): the
    /// whole stack.
    Outermost,
    /// A frame-pointer step found rbp 0, or a return address 0: the end
    /// of a frame-pointer chain.
    FramePointerChainEnd,
    /// A signal frame (SIGNAL row).
    Signal,
    /// A rule the walk cannot follow (UNSUPPORTED row, or a table index
    /// outside `tables`).
    Unsupported,
    /// `max_frames` frames taken.
    MaxFrames,
    /// A read of the stack failed.
    ReadFailed,
    /// A step that did not move the stack pointer up.
    InvalidStep,
}

/// How one frame is stepped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// By a table's row.
    Row(UnwindRow),
    /// By the frame pointer: CFA = rbp + 16, return address at rbp + 8,
    /// the caller's rbp at rbp.
    FramePointer,
    /// A table index the tables do not have.
    BadTable,
}

/// How the frame at `lookup` (an instruction pointer, minus 1 for return
/// addresses) is stepped.
pub fn step_at(
    mappings: &UnwindMappings,
    rows: &[UnwindRow],
    tables: &[UnwindTable],
    lookup: u64,
) -> Step {
    let count = (mappings.count as usize).min(mappings.mappings.len());
    let mappings = &mappings.mappings[..count];
    let after = mappings.partition_point(|mapping| mapping.start <= lookup);
    let Some(mapping) = after.checked_sub(1).map(|index| &mappings[index]) else {
        return Step::FramePointer;
    };
    if lookup >= mapping.end || mapping.unwind != mapping_unwind::TABLE {
        return Step::FramePointer;
    }
    let Some(table) = tables.get(mapping.table as usize) else {
        return Step::BadTable;
    };
    let first = table.first_row as usize;
    let Some(table_rows) = rows.get(first..first + table.row_count as usize) else {
        return Step::BadTable;
    };
    let Ok(pc) = u32::try_from(lookup.wrapping_sub(mapping.bias)) else {
        return Step::FramePointer;
    };
    let after = table_rows.partition_point(|row| row.pc <= pc);
    match after.checked_sub(1).map(|index| table_rows[index]) {
        Some(row) if row.rule != cfa_rule::NO_INFO => Step::Row(row),
        _ => Step::FramePointer,
    }
}

/// Walks a stack from `registers`: the instruction pointers of its frames,
/// innermost first (the first is `registers.ip`), and why the walk ended.
pub fn walk(
    mappings: &UnwindMappings,
    rows: &[UnwindRow],
    tables: &[UnwindTable],
    registers: Registers,
    read_u64: impl Fn(u64) -> Option<u64>,
    max_frames: usize,
) -> (Vec<u64>, WalkEnd) {
    let Registers {
        mut ip,
        mut sp,
        mut bp,
    } = registers;
    let mut frames = Vec::new();
    loop {
        if frames.len() >= max_frames {
            return (frames, WalkEnd::MaxFrames);
        }
        let lookup = if frames.is_empty() { ip } else { ip - 1 };
        frames.push(ip);
        // The CFA first, checked before any read: the caller's stack
        // pointer must be above this frame's.
        let (cfa, rbp_at) = match step_at(mappings, rows, tables, lookup) {
            Step::BadTable => return (frames, WalkEnd::Unsupported),
            Step::FramePointer if bp == 0 => return (frames, WalkEnd::FramePointerChainEnd),
            Step::FramePointer => (bp.wrapping_add(16), Some(bp)),
            Step::Row(row) => {
                let cfa = match row.rule {
                    cfa_rule::RSP => sp.wrapping_add(u64::from(row.cfa_offset)),
                    cfa_rule::RBP => bp.wrapping_add(u64::from(row.cfa_offset)),
                    cfa_rule::PLT => sp.wrapping_add(if ip & 15 >= 11 { 16 } else { 8 }),
                    cfa_rule::END => return (frames, WalkEnd::Outermost),
                    cfa_rule::SIGNAL => return (frames, WalkEnd::Signal),
                    _ => return (frames, WalkEnd::Unsupported),
                };
                let rbp_at = (row.rbp_offset_words != 0)
                    .then(|| cfa.wrapping_add_signed(i64::from(row.rbp_offset_words) * 8));
                (cfa, rbp_at)
            }
        };
        if cfa <= sp {
            return (frames, WalkEnd::InvalidStep);
        }
        let Some(return_address) = read_u64(cfa.wrapping_sub(8)) else {
            return (frames, WalkEnd::ReadFailed);
        };
        let caller_bp = match rbp_at {
            None => bp,
            Some(at) => match read_u64(at) {
                Some(caller_bp) => caller_bp,
                None => return (frames, WalkEnd::ReadFailed),
            },
        };
        if return_address == 0 {
            return (frames, WalkEnd::FramePointerChainEnd);
        }
        (ip, sp, bp) = (return_address, cfa, caller_bp);
    }
}

#[cfg(test)]
#[path = "walk_tests.rs"]
pub(crate) mod tests;
