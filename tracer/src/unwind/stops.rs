//! Where an unwound stack must end: framehop never says that it guessed.
//! Where an address has no unwind information (an object without it, a
//! hand-written assembly function, an address that is not code at all) it
//! walks the frame pointer instead, and in code built without frame
//! pointers that yields junk frames, a different junk below the same real
//! frames at every call: one leak scattered over many stacks. So each
//! frame is checked before it is kept, and a stack that fails a check ends
//! there with its reason, which the report shows as a marker frame.
use std::ops::Range;

use gimli::{BaseAddresses, CieOrFde, DebugFrame, EhFrame, LittleEndian, UnwindSection as _};
use iced_x86::{Decoder, DecoderOptions, FlowControl};

/// Why an unwound stack ends before the thread's first frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum UnwindStop {
    /// A return address outside the target's mapped code.
    OutsideCode,
    /// A return address that does not follow a call instruction.
    NotAfterCall,
    /// A frame whose code has no unwind information (CFI): its caller
    /// could only be guessed.
    NoUnwindInfo,
    /// An unwind rule read outside the copied stack.
    StackReadOutsideCopy,
    /// An unwinding step that left the stack pointer and the address where
    /// they were, or moved them backwards or out of range.
    InvalidStep,
}

impl UnwindStop {
    /// Every reason, in the order reports list them.
    pub const ALL: [UnwindStop; 5] = [
        UnwindStop::OutsideCode,
        UnwindStop::NotAfterCall,
        UnwindStop::NoUnwindInfo,
        UnwindStop::StackReadOutsideCopy,
        UnwindStop::InvalidStep,
    ];

    /// A short name, for counters (`unwinding_stopped_<name>`).
    pub fn name(self) -> &'static str {
        match self {
            UnwindStop::OutsideCode => "outside_code",
            UnwindStop::NotAfterCall => "not_after_call",
            UnwindStop::NoUnwindInfo => "no_unwind_info",
            UnwindStop::StackReadOutsideCopy => "stack_read_outside_copy",
            UnwindStop::InvalidStep => "invalid_step",
        }
    }

    /// What happened, for people.
    pub fn describe(self) -> &'static str {
        match self {
            UnwindStop::OutsideCode => "return address outside the target's code",
            UnwindStop::NotAfterCall => "return address not after a call",
            UnwindStop::NoUnwindInfo => "no unwind information for the code",
            UnwindStop::StackReadOutsideCopy => "unwind rule read outside the copied stack",
            UnwindStop::InvalidStep => "invalid unwinding step",
        }
    }

    /// The frame that ends a stack stopped for this reason.
    pub fn marker(self) -> String {
        format!("[unwinding stopped: {}]", self.describe())
    }
}

impl From<framehop::Error> for UnwindStop {
    fn from(error: framehop::Error) -> Self {
        match error {
            framehop::Error::CouldNotReadStack(_) => UnwindStop::StackReadOutsideCopy,
            framehop::Error::FramepointerUnwindingMovedBackwards
            | framehop::Error::DidNotAdvance
            | framehop::Error::IntegerOverflow
            | framehop::Error::ReturnAddressIsNull => UnwindStop::InvalidStep,
        }
    }
}

/// The object address ranges that `.eh_frame` or `.debug_frame` (at object
/// address `eh_frame_address`, `.text` at `text_address`) describe, sorted
/// and merged. Entries that do not parse are left out: no rule is known
/// for their code.
pub(super) fn unwind_info_ranges(
    eh_frame: Option<(u64, &[u8])>,
    debug_frame: Option<&[u8]>,
    text_address: u64,
) -> Vec<Range<u64>> {
    let mut ranges = Vec::new();
    if let Some((eh_frame_address, bytes)) = eh_frame {
        let bases = BaseAddresses::default()
            .set_eh_frame(eh_frame_address)
            .set_text(text_address);
        let section = EhFrame::new(bytes, LittleEndian);
        let mut entries = section.entries(&bases);
        while let Ok(Some(entry)) = entries.next() {
            if let CieOrFde::Fde(partial) = entry
                && let Ok(fde) = partial.parse(EhFrame::cie_from_offset)
                && fde.len() > 0
            {
                ranges.push(fde.initial_address()..fde.end_address());
            }
        }
    }
    if let Some(bytes) = debug_frame {
        let bases = BaseAddresses::default();
        let mut section = DebugFrame::new(bytes, LittleEndian);
        section.set_address_size(8);
        let mut entries = section.entries(&bases);
        while let Ok(Some(entry)) = entries.next() {
            if let CieOrFde::Fde(partial) = entry
                && let Ok(fde) = partial.parse(DebugFrame::cie_from_offset)
                && fde.len() > 0
            {
                ranges.push(fde.initial_address()..fde.end_address());
            }
        }
    }
    ranges.sort_unstable_by_key(|range| (range.start, range.end));
    let mut merged: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for range in ranges {
        match merged.last_mut() {
            Some(last) if range.start <= last.end => last.end = last.end.max(range.end),
            _ => merged.push(range),
        }
    }
    merged
}

/// Whether sorted, merged `ranges` hold `address`.
pub(super) fn ranges_hold(ranges: &[Range<u64>], address: u64) -> bool {
    let index = ranges.partition_point(|range| range.end <= address);
    ranges
        .get(index)
        .is_some_and(|range| range.contains(&address))
}

/// The longest x86-64 call instruction looked for before a return address
/// (prefixes, REX, opcode, ModRM, SIB, 32-bit displacement).
pub(super) const LONGEST_CALL: usize = 10;

/// Whether `code`, the bytes just before a return address, ends with a
/// call instruction: a direct `call rel32` or an indirect `call` through a
/// register or memory.
pub(super) fn ends_with_call(code: &[u8]) -> bool {
    (2..=code.len().min(LONGEST_CALL)).any(|length| {
        let candidate = &code[code.len() - length..];
        let mut decoder = Decoder::with_ip(64, candidate, 0, DecoderOptions::NONE);
        let instruction = decoder.decode();
        !instruction.is_invalid()
            && instruction.len() == length
            && matches!(
                instruction.flow_control(),
                FlowControl::Call | FlowControl::IndirectCall
            )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognizes_the_calls_before_a_return_address() {
        // call rel32
        assert!(ends_with_call(&[0x90, 0xe8, 0x10, 0x20, 0x30, 0x40]));
        // call *0x69a03(%rip), as rustc calls __rust_alloc
        assert!(ends_with_call(&[0xff, 0x15, 0x03, 0x9a, 0x06, 0x00]));
        // call *%rax; call *%r11 (REX); call *0x10(%rax)
        assert!(ends_with_call(&[0x48, 0x89, 0xc7, 0xff, 0xd0]));
        assert!(ends_with_call(&[0x41, 0xff, 0xd3]));
        assert!(ends_with_call(&[0xff, 0x50, 0x10]));
        // mov %rsp,%rbp; add $0x10,%rsp; a stack address's bytes.
        assert!(!ends_with_call(&[0x48, 0x89, 0xe5]));
        assert!(!ends_with_call(&[0x48, 0x83, 0xc4, 0x10]));
        assert!(!ends_with_call(&[0xc0, 0x7b, 0xc0, 0x64, 0xff, 0x7f]));
        assert!(!ends_with_call(&[]));
    }

    #[test]
    fn looks_up_merged_ranges() {
        let ranges = [0x10..0x20, 0x30..0x40];
        assert!(ranges_hold(&ranges, 0x10));
        assert!(ranges_hold(&ranges, 0x1f));
        assert!(!ranges_hold(&ranges, 0x20));
        assert!(!ranges_hold(&ranges, 0x2f));
        assert!(ranges_hold(&ranges, 0x3f));
        assert!(!ranges_hold(&ranges, 0x40));
        assert!(!ranges_hold(&ranges, 0x5));
    }
}
