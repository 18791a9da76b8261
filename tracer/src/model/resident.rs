//! The resident kind's ledger (`--resident`): the pages each stack made
//! resident, from the target's page faults, madvise and mapping calls, as
//! per-stack counters that take the place of the heap's in a snapshot.
//!
//! The rules:
//! - A page is charged once, at the first fault tracer sees on it, to that
//!   fault's stack (the code that first touched it: usually the allocator
//!   carving a new chunk, or the copy that fills it); later faults on it
//!   (a write after a read, copy-on-write) change nothing.
//! - A write fault that a transparent huge page served charges the huge
//!   page (2 MiB) to the fault's stack, but for pages already charged.
//! - Pages are credited back when their range stops being resident:
//!   munmap, madvise with advice that frees them (`tracer_ebpf::advice::GIVES_BACK`), a
//!   mapping placed over them, a shrinking break; mremap moves them with
//!   their stacks.
//! - What this cannot see: memory made resident before attach (charged
//!   only when faulted again after being given back), growth that reuses
//!   freed memory without a new page, and frees inside the heap that give
//!   no page back (those leave the page charged: resident it is).
//!
//! - Sampled (where faults come fast, `collect` raises a shift s): the
//!   kernel sends the faults of one page in 2^s, chosen by the page's
//!   address, and each charged page stands for 2^s pages, credited back
//!   at the weight it was charged with. A page is in the sample or not
//!   whatever touches it, so the charged bytes of a stack estimate its
//!   resident bytes without bias (Horvitz-Thompson: each page counted with
//!   the inverse of its chance to be seen), and so do the bytes given
//!   back; the relative error of a stack holding P pages is about
//!   sqrt(2^s / P) (1 % for 400 MiB at s = 3).
//!
//! `live_allocs` counts 4 KiB pages; `alloc_count_total` the faults that
//! charged something (both estimates when sampled).

use std::collections::HashMap;

use super::{Counters, Kind, StackId, StackKey, ranges::RangeMap};

/// Who a charged range is charged to, and the sampling shift it was seen
/// at: each of its pages stands for 2^shift.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Charge {
    stack_id: StackId,
    shift: u8,
}

impl Charge {
    fn bytes(self, length: u64) -> i64 {
        (length << self.shift) as i64
    }
}

pub const PAGE_BYTES: u64 = 4096;

fn page_down(address: u64) -> u64 {
    address & !(PAGE_BYTES - 1)
}

fn page_up(address: u64) -> u64 {
    address.saturating_add(PAGE_BYTES - 1) & !(PAGE_BYTES - 1)
}

/// Every traced process's charged pages and the counters per stack.
#[derive(Debug, Default)]
pub struct ResidentLedger {
    processes: HashMap<u32, RangeMap<Charge>>,
    counters: HashMap<StackKey, Counters>,
}

impl ResidentLedger {
    /// Counters of every stack that ever charged a page.
    pub fn counters(&self) -> impl Iterator<Item = (StackKey, Counters)> + '_ {
        self.counters
            .iter()
            .map(|(key, counters)| (*key, *counters))
    }

    /// Whether the page at `address` of `pid` is charged.
    pub fn is_charged(&self, pid: u32, address: u64) -> bool {
        let page = page_down(address);
        self.processes
            .get(&pid)
            .is_some_and(|pages| !pages.overlapping(page, page + PAGE_BYTES).is_empty())
    }

    /// A fault at `address`, sent at sampling shift `shift`: its page is
    /// charged to `stack_id` (for 2^shift pages) unless it is charged
    /// already. Returns whether it was charged now.
    pub fn fault(&mut self, pid: u32, address: u64, stack_id: StackId, shift: u8) -> bool {
        if self.is_charged(pid, address) {
            return false;
        }
        let page = page_down(address);
        let charge = Charge { stack_id, shift };
        self.place(pid, page, page + PAGE_BYTES, charge);
        let counters = self.counters.entry(key(pid, stack_id)).or_default();
        counters.alloc_bytes_total += PAGE_BYTES << shift;
        counters.alloc_count_total += 1 << shift;
        true
    }

    /// A write fault at `address` that a huge page of `length` bytes
    /// served: the pages of that huge page not charged yet go to the
    /// stack that holds the faulting page (charged by the fault itself,
    /// whose event came first).
    pub fn huge_fault(&mut self, pid: u32, address: u64, length: u64) {
        if !length.is_power_of_two() {
            return;
        }
        let Some(pages) = self.processes.get(&pid) else {
            return;
        };
        let page = page_down(address);
        let Some(charge) = pages
            .overlapping(page, page + PAGE_BYTES)
            .first()
            .map(|piece| piece.value)
        else {
            return;
        };
        let start = address & !(length - 1);
        let end = start.saturating_add(length);
        let mut holes = Vec::new();
        let mut at = start;
        for piece in pages.overlapping(start, end) {
            if piece.start > at {
                holes.push((at, piece.start));
            }
            at = at.max(piece.end);
        }
        if at < end {
            holes.push((at, end));
        }
        // The fault itself was counted when its page was charged.
        for (hole_start, hole_end) in holes {
            self.place(pid, hole_start, hole_end, charge);
            self.counters
                .entry(key(pid, charge.stack_id))
                .or_default()
                .alloc_bytes_total += (hole_end - hole_start) << charge.shift;
        }
    }

    /// `[start, end)` of `pid` is no longer resident: its pages are
    /// credited back to the stacks they were charged to.
    pub fn release(&mut self, pid: u32, start: u64, end: u64) {
        let (start, end) = (page_down(start), page_up(end));
        let Some(pages) = self.processes.get_mut(&pid) else {
            return;
        };
        let removal = pages.remove(start, end);
        for piece in removal.clipped(start, end) {
            self.take(pid, piece.value, piece.length_bytes());
        }
    }

    /// mremap moved `[old_start, +old_length)` to `new_start`, `new_length`
    /// long: its charged pages move with it (those past `new_length` are
    /// released); pages of the grown part are charged as they are faulted.
    pub fn remap(
        &mut self,
        pid: u32,
        old_start: u64,
        old_length: u64,
        new_start: u64,
        new_length: u64,
    ) {
        let (old_length, new_length) = (page_up(old_length), page_up(new_length));
        if old_length == 0 {
            // Duplicates a shared mapping: the source stays.
            return;
        }
        let old_end = old_start.saturating_add(old_length);
        let moved = self.processes.get_mut(&pid).map_or_else(Vec::new, |pages| {
            let removal = pages.remove(old_start, old_end);
            for piece in &removal.kept {
                pages.insert_empty(piece.start, piece.end, piece.value);
            }
            removal.clipped(old_start, old_end)
        });
        // Un-count what moved; count it again where it lands.
        for piece in &moved {
            self.take(pid, piece.value, piece.length_bytes());
        }
        self.release(pid, new_start, new_start.saturating_add(new_length));
        for piece in moved {
            let offset = piece.start - old_start;
            if offset >= new_length {
                continue;
            }
            let start = new_start + offset;
            let end = new_start + (piece.end - old_start).min(new_length);
            self.place(pid, start, end, piece.value);
        }
    }

    /// Forgets `pid` (it exited, or its image was replaced).
    pub fn forget(&mut self, pid: u32) {
        if let Some(pages) = self.processes.remove(&pid) {
            for piece in pages.iter() {
                self.take(pid, piece.value, piece.length_bytes());
            }
        }
    }

    /// Puts `[start, end)` on its stack's live counters.
    fn place(&mut self, pid: u32, start: u64, end: u64, charge: Charge) {
        if start >= end {
            return;
        }
        self.processes
            .entry(pid)
            .or_default()
            .insert_merging(start, end, charge);
        let counters = self.counters.entry(key(pid, charge.stack_id)).or_default();
        let bytes = charge.bytes(end - start);
        counters.live_bytes += bytes;
        counters.live_allocs += bytes / PAGE_BYTES as i64;
    }

    /// Takes `length` bytes of a range charged with `charge` off its
    /// stack's live counters.
    fn take(&mut self, pid: u32, charge: Charge, length: u64) {
        let counters = self.counters.entry(key(pid, charge.stack_id)).or_default();
        let bytes = charge.bytes(length);
        counters.live_bytes -= bytes;
        counters.live_allocs -= bytes / PAGE_BYTES as i64;
    }
}

fn key(pid: u32, stack_id: StackId) -> StackKey {
    StackKey {
        pid,
        stack_id,
        kind: Kind::Resident,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: StackId = StackId::Mapping(1);
    const B: StackId = StackId::Mapping(2);

    fn live(ledger: &ResidentLedger, stack_id: StackId) -> (i64, i64) {
        ledger
            .counters()
            .find(|(key, _)| key.stack_id == stack_id)
            .map_or((0, 0), |(_, counters)| {
                (counters.live_bytes, counters.live_allocs)
            })
    }

    #[test]
    fn a_page_is_charged_once_to_the_stack_that_touched_it_first() {
        let mut ledger = ResidentLedger::default();
        assert!(ledger.fault(7, 0x10_0010, A, 0));
        assert!(
            !ledger.fault(7, 0x10_0ff0, B, 0),
            "a second fault on the page"
        );
        assert!(ledger.fault(7, 0x10_1000, A, 0));
        assert!(ledger.fault(7, 0x10_2000, B, 0));
        assert_eq!(live(&ledger, A), (8192, 2));
        assert_eq!(live(&ledger, B), (4096, 1));
        assert!(ledger.fault(8, 0x10_0010, B, 0), "another process's page");
    }

    #[test]
    fn released_ranges_credit_each_stack_its_own_pages() {
        let mut ledger = ResidentLedger::default();
        for page in 0..8 {
            ledger.fault(
                7,
                0x10_0000 + page * PAGE_BYTES,
                if page < 6 { A } else { B },
                0,
            );
        }
        // madvise(DONTNEED) of pages 2..7, with an unaligned end.
        ledger.release(7, 0x10_2000, 0x10_6ff0);
        assert_eq!(live(&ledger, A), (2 * 4096, 2));
        assert_eq!(live(&ledger, B), (4096, 1));
        // Refaulted after being given back: charged again.
        assert!(ledger.fault(7, 0x10_3000, B, 0));
        ledger.forget(7);
        assert_eq!(live(&ledger, A), (0, 0));
        assert_eq!(live(&ledger, B), (0, 0));
    }

    #[test]
    fn a_huge_page_charges_its_uncharged_pages_to_the_faulting_stack() {
        let mut ledger = ResidentLedger::default();
        let huge = 2 << 20;
        ledger.fault(7, 0x40_0000, B, 0);
        ledger.fault(7, 0x40_5123, A, 0);
        ledger.huge_fault(7, 0x40_5123, huge);
        assert_eq!(live(&ledger, B), (4096, 1));
        assert_eq!(live(&ledger, A), (huge as i64 - 4096, 511));
        let total: u64 = ledger
            .counters()
            .map(|(_, counters)| counters.alloc_bytes_total)
            .sum();
        assert_eq!(total, huge);
    }

    #[test]
    fn a_sampled_page_stands_for_its_weight_until_given_back() {
        let mut ledger = ResidentLedger::default();
        ledger.fault(7, 0x10_0000, A, 3);
        ledger.fault(7, 0x10_1000, A, 0);
        assert_eq!(live(&ledger, A), (9 * 4096, 9));
        ledger.release(7, 0x10_0000, 0x10_1000);
        assert_eq!(live(&ledger, A), (4096, 1));
        let (_, counters) = ledger.counters().next().unwrap();
        assert_eq!(counters.alloc_bytes_total, 9 * 4096);
        assert_eq!(counters.alloc_count_total, 9);
    }

    #[test]
    fn remapped_pages_move_with_their_stacks() {
        let mut ledger = ResidentLedger::default();
        for page in 0..4 {
            ledger.fault(7, 0x10_0000 + page * PAGE_BYTES, A, 0);
        }
        // Moved and shrunk to 3 pages: one page released.
        ledger.remap(7, 0x10_0000, 4 * PAGE_BYTES, 0x90_0000, 3 * PAGE_BYTES);
        assert_eq!(live(&ledger, A), (3 * 4096, 3));
        assert!(ledger.is_charged(7, 0x90_2000));
        assert!(!ledger.is_charged(7, 0x10_0000));
        assert!(!ledger.fault(7, 0x90_1000, B, 0));
    }
}
