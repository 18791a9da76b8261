//! Unwind tables for the kernel's own walker: an object's `.eh_frame` and
//! `.debug_frame` turned into the compact rows of `tracer_ebpf::UnwindRow`,
//! sorted by address, one rule per run of addresses.
//!
//! DWARF call frame information can say much more than the kernel can
//! follow in a few instructions per frame; a row keeps only what finds the
//! caller on x86-64 (the CFA from rsp or rbp plus an offset, where rbp was
//! saved) and marks the rest so the walk stops with a reason: PLT entries'
//! expression (the one expression common enough to decode), signal frames,
//! the outermost frame, and everything else as unsupported. Addresses
//! between FDEs get a NO_INFO row, so a search never applies one
//! function's rule to the code after it.
//!
//! A compressed `.debug_frame` (Go's) is not read: Go code keeps frame
//! pointers, and its CFI never says where rbp is saved, so a NO_INFO row
//! (walked by the frame pointer) serves it better than its own rules.
//!
//! Built in one pass over the FDEs in address order, reusing one gimli
//! unwind context; the only allocations are the output rows, an index of
//! the FDEs (24 bytes each) and the parsed CIEs.
use std::collections::HashMap;

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, CommonInformationEntry, DebugFrame, EhFrame, EndianSlice,
    LittleEndian, Register, RegisterRule, UnwindContext, UnwindOffset, UnwindSection,
    UnwindTableRow, X86_64,
};
use tracer_ebpf::{UnwindRow, cfa_rule};

use super::modules::ObjectInfo;

type Slice<'a> = EndianSlice<'a, LittleEndian>;

/// The call frame sections of one object.
#[derive(Clone, Copy, Debug, Default)]
pub struct FrameSections<'a> {
    /// `.eh_frame`'s object address and bytes.
    pub eh_frame: Option<(u64, &'a [u8])>,
    /// `.debug_frame`'s bytes (absolute addresses).
    pub debug_frame: Option<&'a [u8]>,
    /// `.text`'s object address (for the rare text-relative pointers).
    pub text_address: u64,
}

impl<'a> FrameSections<'a> {
    pub fn of(object: &'a ObjectInfo) -> FrameSections<'a> {
        FrameSections {
            eh_frame: object.eh_frame(),
            debug_frame: object.debug_frame(),
            text_address: object.text().map_or(0, |text| text.start),
        }
    }
}

/// The rows built for one object, and what was left out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BuiltRows {
    /// Sorted by `pc`, no two consecutive rows with the same rule; the last
    /// row is NO_INFO (the end of the last FDE).
    pub rows: Vec<UnwindRow>,
    /// FDEs turned into rows.
    pub fdes: u32,
    /// FDEs left out: they do not parse, their addresses do not fit the
    /// rows' 32 bits, or (from `.debug_frame`) `.eh_frame` covers them.
    pub fdes_skipped: u32,
}

impl BuiltRows {
    /// Bytes the rows take in the kernel's row map.
    pub fn bytes(&self) -> usize {
        self.rows.len() * std::mem::size_of::<UnwindRow>()
    }
}

/// Which section an FDE comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Source {
    EhFrame,
    DebugFrame,
}

/// Where one FDE is and what it covers.
#[derive(Clone, Copy, Debug)]
struct FdeRef {
    start: u64,
    end: u64,
    offset: usize,
    source: Source,
}

/// The PLT entries' CFA expression (what binutils' ld writes for `.plt`):
/// `DW_OP_breg7 (rsp) 8; DW_OP_breg16 (rip) 0; DW_OP_lit15; DW_OP_and;
/// DW_OP_lit11; DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus`, i.e.
/// rsp + 8 + ((rip & 15) >= 11) << 3. The byte at index 6 is the
/// threshold's literal (`DW_OP_lit10` in some linkers' layouts).
const PLT_EXPRESSION: [u8; 11] = [
    0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22,
];
const PLT_THRESHOLD_INDEX: usize = 6;
const DW_OP_LIT10: u8 = 0x3a;

/// Whether a CFA expression is the PLT's.
fn is_plt_expression(bytes: &[u8]) -> bool {
    bytes.len() == PLT_EXPRESSION.len()
        && bytes
            .iter()
            .zip(PLT_EXPRESSION)
            .enumerate()
            .all(|(index, (&byte, expected))| {
                byte == expected || (index == PLT_THRESHOLD_INDEX && byte == DW_OP_LIT10)
            })
}

/// Builds the rows of an object from its call frame sections. Never fails:
/// what does not parse is counted in `fdes_skipped`, and an object without
/// either section gets no rows.
pub fn build_rows(sections: &FrameSections<'_>) -> BuiltRows {
    let mut built = BuiltRows::default();
    let mut eh_frame = sections.eh_frame.map(|(address, bytes)| {
        let mut section = EhFrame::new(bytes, LittleEndian);
        section.set_address_size(8);
        let bases = BaseAddresses::default()
            .set_eh_frame(address)
            .set_text(sections.text_address);
        (section, bases)
    });
    let mut debug_frame = sections.debug_frame.map(|bytes| {
        let mut section = DebugFrame::new(bytes, LittleEndian);
        section.set_address_size(8);
        (section, BaseAddresses::default())
    });

    let mut eh_cies = HashMap::new();
    let mut debug_cies = HashMap::new();
    let mut fdes = Vec::new();
    if let Some((section, bases)) = &eh_frame {
        index_fdes(
            section,
            bases,
            Source::EhFrame,
            &mut eh_cies,
            &mut fdes,
            &mut built,
        );
    }
    fdes.sort_unstable_by_key(|fde| (fde.start, fde.end));
    if let Some((section, bases)) = &debug_frame {
        let eh_count = fdes.len();
        let mut from_debug = Vec::new();
        index_fdes(
            section,
            bases,
            Source::DebugFrame,
            &mut debug_cies,
            &mut from_debug,
            &mut built,
        );
        for fde in from_debug {
            // `.eh_frame` wins where both describe the same code: it is
            // what the program's own unwinder uses.
            let after = fdes[..eh_count].partition_point(|eh| eh.start < fde.end);
            let overlaps = after > 0
                && fdes[..after]
                    .iter()
                    .rev()
                    .take(4)
                    .any(|eh| eh.end > fde.start);
            if overlaps {
                built.fdes_skipped += 1;
            } else {
                fdes.push(fde);
            }
        }
        fdes.sort_unstable_by_key(|fde| (fde.start, fde.end));
    }

    let mut context = UnwindContext::new();
    let mut covered_to = 0u64;
    for fde in &fdes {
        if fde.end <= covered_to {
            built.fdes_skipped += 1;
            continue;
        }
        let emitted = match fde.source {
            Source::EhFrame => {
                let (section, bases) = eh_frame.as_mut().expect("indexed from it");
                emit_fde(
                    section,
                    bases,
                    &mut eh_cies,
                    fde,
                    covered_to,
                    &mut context,
                    &mut built.rows,
                )
            }
            Source::DebugFrame => {
                let (section, bases) = debug_frame.as_mut().expect("indexed from it");
                emit_fde(
                    section,
                    bases,
                    &mut debug_cies,
                    fde,
                    covered_to,
                    &mut context,
                    &mut built.rows,
                )
            }
        };
        if emitted {
            built.fdes += 1;
            covered_to = fde.end;
        } else {
            built.fdes_skipped += 1;
        }
    }
    // Kept until the rows are written to the kernel: no spare capacity.
    built.rows.shrink_to_fit();
    built
}

/// Adds every FDE of a section that parses and fits 32 bits to `fdes`.
fn index_fdes<'a, S>(
    section: &S,
    bases: &BaseAddresses,
    source: Source,
    cies: &mut HashMap<usize, CommonInformationEntry<Slice<'a>>>,
    fdes: &mut Vec<FdeRef>,
    built: &mut BuiltRows,
) where
    S: UnwindSection<Slice<'a>>,
{
    let mut entries = section.entries(bases);
    loop {
        match entries.next() {
            Ok(Some(CieOrFde::Fde(partial))) => {
                let offset = partial.offset();
                match partial.parse(|section, bases, cie| cached_cie(cies, section, bases, cie)) {
                    Ok(fde) if fde.len() == 0 => {}
                    // An end that wraps around lies below its start.
                    Ok(fde)
                        if fde.initial_address() < fde.end_address()
                            && fde.end_address() < 1 << 32 =>
                    {
                        fdes.push(FdeRef {
                            start: fde.initial_address(),
                            end: fde.end_address(),
                            offset,
                            source,
                        })
                    }
                    _ => built.fdes_skipped += 1,
                }
            }
            Ok(Some(CieOrFde::Cie(_))) => {}
            // A section that stops parsing keeps what came before.
            Ok(None) | Err(_) => break,
        }
    }
}

/// A CIE parsed once per section.
fn cached_cie<'a, S>(
    cies: &mut HashMap<usize, CommonInformationEntry<Slice<'a>>>,
    section: &S,
    bases: &BaseAddresses,
    offset: S::Offset,
) -> gimli::Result<CommonInformationEntry<Slice<'a>>>
where
    S: UnwindSection<Slice<'a>>,
{
    let key = UnwindOffset::into(offset);
    if let Some(cie) = cies.get(&key) {
        return Ok(cie.clone());
    }
    let cie = section.cie_from_offset(bases, offset)?;
    cies.insert(key, cie.clone());
    Ok(cie)
}

/// Appends the rows of one FDE from `covered_to` on (an earlier FDE
/// covers what is before), after a NO_INFO row for a gap before it; false
/// when its instructions do not evaluate (nothing appended then).
fn emit_fde<'a, S>(
    section: &S,
    bases: &BaseAddresses,
    cies: &mut HashMap<usize, CommonInformationEntry<Slice<'a>>>,
    fde_ref: &FdeRef,
    covered_to: u64,
    context: &mut UnwindContext<usize>,
    rows: &mut Vec<UnwindRow>,
) -> bool
where
    S: UnwindSection<Slice<'a>>,
{
    let Ok(fde) = section.fde_from_offset(
        bases,
        S::Offset::from(fde_ref.offset),
        |section, bases, cie| cached_cie(cies, section, bases, cie),
    ) else {
        return false;
    };
    let signal = fde.is_signal_trampoline();
    let return_address = fde.cie().return_address_register();
    let Ok(mut table) = fde.rows(section, bases, context) else {
        return false;
    };
    // What to go back to when the instructions fail: push_row may
    // replace the last row (one at the same address), never one before.
    let rollback = rows.len();
    let last = rows.last().copied();
    if fde_ref.start > covered_to {
        push_row(rows, covered_to, NO_INFO_ROW);
    }
    loop {
        match table.next_row() {
            Ok(Some(row)) => {
                // Instructions that advance past the FDE's end describe
                // no code of it (and would put a row after the end row).
                if row.start_address() >= fde_ref.end {
                    break;
                }
                if row.end_address() <= covered_to || row.start_address() == row.end_address() {
                    continue;
                }
                let rule = row_rule(row, section, signal, return_address);
                push_row(rows, row.start_address().max(covered_to), rule);
            }
            Ok(None) => break,
            Err(_) => {
                rows.truncate(rollback.saturating_sub(1));
                rows.extend(last);
                return false;
            }
        }
    }
    push_row(rows, fde_ref.end, NO_INFO_ROW);
    true
}

/// A row's rule, without its address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rule {
    cfa_offset: u16,
    rule: u8,
    rbp_offset_words: i8,
}

const fn only(rule: u8) -> Rule {
    Rule {
        cfa_offset: 0,
        rule,
        rbp_offset_words: 0,
    }
}

const NO_INFO_ROW: Rule = only(cfa_rule::NO_INFO);
const UNSUPPORTED_ROW: Rule = only(cfa_rule::UNSUPPORTED);

/// Appends a row at `pc`: it replaces a previous row at the same address
/// (which then covered nothing), and is left out when it says what the
/// previous row says.
fn push_row(rows: &mut Vec<UnwindRow>, pc: u64, rule: Rule) {
    let pc = pc as u32;
    if rows.last().is_some_and(|last| last.pc == pc) {
        rows.pop();
    }
    if let Some(last) = rows.last()
        && (last.cfa_offset, last.rule, last.rbp_offset_words)
            == (rule.cfa_offset, rule.rule, rule.rbp_offset_words)
    {
        return;
    }
    rows.push(UnwindRow {
        pc,
        cfa_offset: rule.cfa_offset,
        rule: rule.rule,
        rbp_offset_words: rule.rbp_offset_words,
    });
}

/// What the kernel does with one gimli row.
fn row_rule<'a, S>(
    row: &UnwindTableRow<usize>,
    section: &S,
    signal: bool,
    return_address: Register,
) -> Rule
where
    S: UnwindSection<Slice<'a>>,
{
    if signal {
        return only(cfa_rule::SIGNAL);
    }
    match row.register(return_address) {
        Some(RegisterRule::Undefined) => return only(cfa_rule::END),
        Some(RegisterRule::Offset(-8)) => {}
        _ => return UNSUPPORTED_ROW,
    }
    let rbp_offset_words = match row.register(X86_64::RBP) {
        None | Some(RegisterRule::SameValue) | Some(RegisterRule::Undefined) => 0,
        Some(RegisterRule::Offset(offset)) if offset != 0 && offset % 8 == 0 => {
            match i8::try_from(offset / 8) {
                Ok(words) => words,
                Err(_) => return UNSUPPORTED_ROW,
            }
        }
        Some(_) => return UNSUPPORTED_ROW,
    };
    match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            let rule = match *register {
                X86_64::RSP => cfa_rule::RSP,
                X86_64::RBP => cfa_rule::RBP,
                _ => return UNSUPPORTED_ROW,
            };
            match u16::try_from(*offset) {
                Ok(cfa_offset) => Rule {
                    cfa_offset,
                    rule,
                    rbp_offset_words,
                },
                Err(_) => UNSUPPORTED_ROW,
            }
        }
        CfaRule::Expression(expression) => match expression.get(section) {
            Ok(bytes) if is_plt_expression(bytes.0.slice()) => Rule {
                cfa_offset: 0,
                rule: cfa_rule::PLT,
                rbp_offset_words,
            },
            _ => UNSUPPORTED_ROW,
        },
    }
}

/// The row that applies at object address `pc`: the last one at or below
/// it (None below the first row, or past 32 bits).
pub fn row_for(rows: &[UnwindRow], pc: u64) -> Option<&UnwindRow> {
    let pc = u32::try_from(pc).ok()?;
    let after = rows.partition_point(|row| row.pc <= pc);
    after.checked_sub(1).map(|index| &rows[index])
}

#[cfg(test)]
#[path = "tables_tests.rs"]
mod tests;
