//! The decisions of the kernel's walk of a stack through the unwind
//! tables (`tracer-ebpf/src/unwind.rs`), as plain functions that build for
//! the host too, where they are tested: which mapping and which row hold
//! an instruction pointer, and how a row or a frame pointer gives the
//! caller's registers.
//!
//! The binary searches keep their bounds in a [`Bounds`]: the kernel's
//! keep them in map memory, which the verifier does not follow, so the
//! two outcomes of each step meet again at the next one instead of
//! doubling the paths it checks.
use crate::{MAX_UNWIND_MAPPINGS, UnwindMapping, UnwindRow, cfa_rule, stat};

/// The bounds `lo..hi` of a binary search between its steps.
pub trait Bounds {
    fn get(&self) -> (u32, u32);
    fn set(&mut self, lo: u32, hi: u32);
}

/// Bounds in plain memory (tests, userspace).
#[derive(Clone, Copy, Debug, Default)]
pub struct PlainBounds(pub u32, pub u32);

impl Bounds for PlainBounds {
    fn get(&self) -> (u32, u32) {
        (self.0, self.1)
    }
    fn set(&mut self, lo: u32, hi: u32) {
        self.0 = lo;
        self.1 = hi;
    }
}

/// Steps of the search over a process's mappings (`MAX_UNWIND_MAPPINGS`
/// is 2^10: 11 halvings of 0..=1024).
pub const MAPPING_SEARCH_STEPS: u32 = 11;

/// The index of the last of `count` sorted keys (`key_at`) at or below
/// `key`, found in at most `steps` halvings from `bounds` `0..count`;
/// None when every key is above it, a key cannot be read, or the search
/// did not end within `steps`.
#[inline(always)]
pub fn last_at_or_below(
    bounds: &mut impl Bounds,
    count: u32,
    steps: u32,
    key: u64,
    mut key_at: impl FnMut(u32) -> Option<u64>,
) -> Option<u32> {
    bounds.set(0, count);
    let mut ended = false;
    for _ in 0..steps {
        let (lo, hi) = bounds.get();
        if lo >= hi {
            ended = true;
            break;
        }
        let mid = lo + (hi - lo) / 2;
        if key_at(mid)? <= key {
            bounds.set(mid + 1, hi);
        } else {
            bounds.set(lo, mid);
        }
    }
    let (lo, hi) = bounds.get();
    if !ended && lo < hi {
        return None;
    }
    lo.checked_sub(1)
}

/// The index of the mapping of `mappings` (the first `count`, sorted by
/// start, not overlapping) that holds `address`.
#[inline(always)]
pub fn find_mapping(
    bounds: &mut impl Bounds,
    mappings: &[UnwindMapping; MAX_UNWIND_MAPPINGS],
    count: u32,
    address: u64,
) -> Option<usize> {
    let count = count.min(MAX_UNWIND_MAPPINGS as u32);
    let index = last_at_or_below(bounds, count, MAPPING_SEARCH_STEPS, address, |index| {
        Some(mappings[index as usize & (MAX_UNWIND_MAPPINGS - 1)].start)
    })? as usize
        & (MAX_UNWIND_MAPPINGS - 1);
    (address < mappings[index].end).then_some(index)
}

/// The registers a frame is unwound from, and what it gives its caller.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Registers {
    /// A return address (the innermost frame's too: the walk starts at an
    /// allocator's return or after a system call instruction).
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

impl Registers {
    /// The address whose row applies: the call instruction's, one byte
    /// before the return address (the last byte of a function that ends
    /// with a call is another function's first).
    pub fn lookup_address(&self) -> u64 {
        self.ip.wrapping_sub(1)
    }
}

/// One step of the walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The caller's registers: its return address is the next frame.
    Caller(Registers),
    /// The stack ends here, completely (the thread's first frame).
    End,
    /// The walk stops here, for the reason of this `stat` id.
    Stop(u32),
}

/// The caller by the frame pointer: the saved rbp at `bp`, the return
/// address above it (CFA = rbp + 16). A frame pointer of 0 is the end
/// (`_start` and thread starts clear it).
#[inline(always)]
pub fn step_by_frame_pointer(regs: Registers, read: impl FnMut(u64) -> Option<u64>) -> Step {
    if regs.bp == 0 {
        return Step::End;
    }
    step_to(regs, regs.bp.wrapping_add(16), Some(regs.bp), read)
}

/// The caller by a table row. `NO_INFO` rows go by the frame pointer.
#[inline(always)]
pub fn step_by_row(row: &UnwindRow, regs: Registers, read: impl FnMut(u64) -> Option<u64>) -> Step {
    let cfa = match row.rule {
        cfa_rule::RSP => regs.sp.wrapping_add(row.cfa_offset as u64),
        cfa_rule::RBP => regs.bp.wrapping_add(row.cfa_offset as u64),
        cfa_rule::PLT => regs
            .sp
            .wrapping_add(if regs.ip & 15 >= 11 { 16 } else { 8 }),
        cfa_rule::END => return Step::End,
        cfa_rule::SIGNAL => return Step::Stop(stat::UNWIND_STOP_SIGNAL),
        cfa_rule::NO_INFO => return step_by_frame_pointer(regs, read),
        _ => return Step::Stop(stat::UNWIND_STOP_UNSUPPORTED),
    };
    let rbp_at = (row.rbp_offset_words != 0)
        .then(|| cfa.wrapping_add((row.rbp_offset_words as i64 * 8) as u64));
    step_to(regs, cfa, rbp_at, read)
}

/// The step to the caller whose stack pointer is `cfa` (its return
/// address just below), with its rbp read at `rbp_at` (None: the same as
/// this frame's). A CFA that is not above the stack pointer is no frame;
/// a return address of 0 ends the stack.
#[inline(always)]
fn step_to(
    regs: Registers,
    cfa: u64,
    rbp_at: Option<u64>,
    mut read: impl FnMut(u64) -> Option<u64>,
) -> Step {
    if cfa <= regs.sp {
        return Step::Stop(stat::UNWIND_STOP_INVALID);
    }
    let Some(ip) = read(cfa.wrapping_sub(8)) else {
        return Step::Stop(stat::UNWIND_STOP_READ_FAULT);
    };
    let bp = match rbp_at {
        None => regs.bp,
        Some(at) => match read(at) {
            Some(bp) => bp,
            None => return Step::Stop(stat::UNWIND_STOP_READ_FAULT),
        },
    };
    if ip == 0 {
        return Step::End;
    }
    Step::Caller(Registers { ip, sp: cfa, bp })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping_unwind;

    fn mappings(ranges: &[(u64, u64)]) -> [UnwindMapping; MAX_UNWIND_MAPPINGS] {
        let mut table = [UnwindMapping::default(); MAX_UNWIND_MAPPINGS];
        for (slot, &(start, end)) in table.iter_mut().zip(ranges) {
            *slot = UnwindMapping {
                start,
                end,
                bias: 0,
                unwind: mapping_unwind::TABLE,
                table: 0,
            };
        }
        table
    }

    #[test]
    fn finds_the_mapping_that_holds_an_address() {
        let table = mappings(&[(0x1000, 0x2000), (0x3000, 0x5000), (0x5000, 0x6000)]);
        let find = |address| find_mapping(&mut PlainBounds::default(), &table, 3, address);
        assert_eq!(find(0xfff), None);
        assert_eq!(find(0x1000), Some(0));
        assert_eq!(find(0x1fff), Some(0));
        assert_eq!(find(0x2000), None);
        assert_eq!(find(0x4fff), Some(1));
        assert_eq!(find(0x5000), Some(2));
        assert_eq!(find(0x6000), None);
        assert_eq!(
            find_mapping(&mut PlainBounds::default(), &table, 0, 0x1000),
            None
        );
    }

    #[test]
    fn searches_a_full_mapping_table_within_its_steps() {
        let ranges: Vec<(u64, u64)> = (0..MAX_UNWIND_MAPPINGS as u64)
            .map(|index| (index * 0x1000, index * 0x1000 + 0x800))
            .collect();
        let table = mappings(&ranges);
        for (index, &(start, end)) in ranges.iter().enumerate() {
            let find = |address| {
                find_mapping(
                    &mut PlainBounds::default(),
                    &table,
                    MAX_UNWIND_MAPPINGS as u32,
                    address,
                )
            };
            assert_eq!(find(start), Some(index));
            assert_eq!(find(end - 1), Some(index));
            assert_eq!(find(end), None);
        }
    }

    #[test]
    fn finds_the_last_row_at_or_below_within_2_to_the_24_rows() {
        let count = 1u32 << crate::UNWIND_ROW_SEARCH_STEPS;
        let steps = crate::UNWIND_ROW_SEARCH_STEPS + 1;
        // Rows at every even pc.
        let row_pc = |index: u32| Some(index as u64 * 2);
        for key in [0u64, 1, 2, 777, 2 * count as u64 - 2, 2 * count as u64 + 5] {
            let found = last_at_or_below(&mut PlainBounds::default(), count, steps, key, row_pc);
            assert_eq!(found, Some((key / 2).min(count as u64 - 1) as u32), "{key}");
        }
        let above = last_at_or_below(&mut PlainBounds::default(), 3, steps, 5, |index| {
            Some(10 + index as u64)
        });
        assert_eq!(above, None);
        // Too few steps for the rows: no answer rather than a wrong one.
        let short = last_at_or_below(&mut PlainBounds::default(), count, 3, 777, row_pc);
        assert_eq!(short, None);
    }

    /// A stack of words at 0x7000.. for the steps to read.
    fn memory(words: &[u64]) -> impl FnMut(u64) -> Option<u64> + '_ {
        move |address| {
            let offset = address.checked_sub(0x7000)?;
            (offset % 8 == 0)
                .then(|| words.get(offset as usize / 8).copied())
                .flatten()
        }
    }

    #[test]
    fn rows_give_the_callers_registers() {
        let words = [0, 0x7040, 0x4242, 0, 0];
        let regs = Registers {
            ip: 0x1234,
            sp: 0x7000,
            bp: 0x9999,
        };
        // CFA = rsp + 24: return address at 0x7010, rbp saved at CFA - 16.
        let row = UnwindRow {
            pc: 0,
            cfa_offset: 24,
            rule: cfa_rule::RSP,
            rbp_offset_words: -2,
        };
        assert_eq!(
            step_by_row(&row, regs, memory(&words)),
            Step::Caller(Registers {
                ip: 0x4242,
                sp: 0x7018,
                bp: 0x7040
            })
        );
        // rbp not saved: it keeps its value.
        let row = UnwindRow {
            rbp_offset_words: 0,
            ..row
        };
        assert_eq!(
            step_by_row(&row, regs, memory(&words)),
            Step::Caller(Registers {
                ip: 0x4242,
                sp: 0x7018,
                bp: 0x9999
            })
        );
        // CFA = rbp + 16 (a frame-pointer frame described by its CFI).
        let row = UnwindRow {
            pc: 0,
            cfa_offset: 16,
            rule: cfa_rule::RBP,
            rbp_offset_words: -2,
        };
        let regs = Registers { bp: 0x7008, ..regs };
        assert_eq!(
            step_by_row(&row, regs, memory(&words)),
            Step::Caller(Registers {
                ip: 0x4242,
                sp: 0x7018,
                bp: 0x7040
            })
        );
    }

    #[test]
    fn rows_that_end_or_stop_the_walk() {
        let words = [0x4242, 0];
        let regs = Registers {
            ip: 0x1234,
            sp: 0x7000,
            bp: 0,
        };
        let row = |rule| UnwindRow {
            pc: 0,
            cfa_offset: 8,
            rule,
            rbp_offset_words: 0,
        };
        let step = |rule| step_by_row(&row(rule), regs, memory(&words));
        assert_eq!(step(cfa_rule::END), Step::End);
        assert_eq!(step(cfa_rule::SIGNAL), Step::Stop(stat::UNWIND_STOP_SIGNAL));
        assert_eq!(
            step(cfa_rule::UNSUPPORTED),
            Step::Stop(stat::UNWIND_STOP_UNSUPPORTED)
        );
        // No information: the frame pointer, 0 here, ends the stack.
        assert_eq!(step(cfa_rule::NO_INFO), Step::End);
        // A return address outside the stack read.
        let far = UnwindRow {
            cfa_offset: 0x800,
            ..row(cfa_rule::RSP)
        };
        assert_eq!(
            step_by_row(&far, regs, memory(&words)),
            Step::Stop(stat::UNWIND_STOP_READ_FAULT)
        );
        // A CFA that does not move the stack pointer up.
        let still = UnwindRow {
            cfa_offset: 0,
            ..row(cfa_rule::RSP)
        };
        let regs = Registers { sp: 0x7008, ..regs };
        assert_eq!(
            step_by_row(&still, regs, memory(&words)),
            Step::Stop(stat::UNWIND_STOP_INVALID)
        );
        // The return address read as 0: the end.
        let row = UnwindRow {
            cfa_offset: 8,
            ..row(cfa_rule::RSP)
        };
        assert_eq!(step_by_row(&row, regs, memory(&words)), Step::End);
    }

    #[test]
    fn plt_entries_before_and_after_their_push() {
        let words = [0x4242, 0x5353, 0];
        let at = |ip| Registers {
            ip,
            sp: 0x7000,
            bp: 0,
        };
        let row = UnwindRow {
            pc: 0,
            cfa_offset: 0,
            rule: cfa_rule::PLT,
            rbp_offset_words: 0,
        };
        let Step::Caller(before) = step_by_row(&row, at(0x1020), memory(&words)) else {
            panic!("no caller");
        };
        assert_eq!((before.ip, before.sp), (0x4242, 0x7008));
        let Step::Caller(after) = step_by_row(&row, at(0x102b), memory(&words)) else {
            panic!("no caller");
        };
        assert_eq!((after.ip, after.sp), (0x5353, 0x7010));
    }

    #[test]
    fn frame_pointers_walk_and_end() {
        // rbp at 0x7008: saved rbp 0x7020, return address 0x4242.
        let words = [0, 0x7020, 0x4242, 0, 0, 0];
        let regs = Registers {
            ip: 0x1234,
            sp: 0x7000,
            bp: 0x7008,
        };
        assert_eq!(
            step_by_frame_pointer(regs, memory(&words)),
            Step::Caller(Registers {
                ip: 0x4242,
                sp: 0x7018,
                bp: 0x7020
            })
        );
        let ended = Registers { bp: 0, ..regs };
        assert_eq!(step_by_frame_pointer(ended, memory(&words)), Step::End);
        let below = Registers { bp: 0x6fe0, ..regs };
        assert_eq!(
            step_by_frame_pointer(below, memory(&words)),
            Step::Stop(stat::UNWIND_STOP_INVALID)
        );
        let unreadable = Registers { bp: 0x9000, ..regs };
        assert_eq!(
            step_by_frame_pointer(unreadable, memory(&words)),
            Step::Stop(stat::UNWIND_STOP_READ_FAULT)
        );
    }
}
