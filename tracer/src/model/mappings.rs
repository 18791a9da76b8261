//! The mapping kinds' ledger: applies the target's mmap, munmap, mremap,
//! brk and mprotect calls to one range map per process and keeps the
//! per-stack counters that join the kernel's heap counters in a snapshot.
//!
//! Why userspace: a munmap may cut any number of mappings, and the eBPF
//! verifier allows neither the loop nor the tree that exact arithmetic
//! needs. Mapping calls are rare (each is a system call), so sending them
//! one by one costs little, and here the arithmetic is plain, unit-tested
//! code over a B-tree.
//!
//! The rules:
//! - Counted once: a mapping made while the thread is inside a traced
//!   allocator call (glibc's malloc mapping a large block, growing an arena
//!   or the break) is the allocator's, already counted as heap under the
//!   caller of malloc; it is not counted again. Removals (munmap, the
//!   target of a MAP_FIXED or moved mremap, a shrinking brk) always apply.
//! - A mapping made before attach is unknown: unmapping, moving or growing
//!   it changes nothing.
//! - mremap keeps the stack and kind of what it moves; grown bytes count for
//!   the piece that ended at the old end.
//! - Reserved, not memory: PROT_NONE ranges and thread stacks (MAP_STACK)
//!   are `mmap-reserved`; an mprotect that makes a PROT_NONE range usable
//!   moves it to `mmap-anon` or `mmap-file`, and back.
//! - `live_allocs` of a mapping kind counts pieces: a mapping split by a
//!   partial munmap or mprotect counts twice.

use std::collections::HashMap;

use tracer_ebpf::{MappingEvent, mapping_call};

use super::{
    Counters, Kind, StackId, StackKey,
    ranges::{Piece, RangeMap},
};

const PAGE_SIZE: u64 = 4096;
const PROT_NONE: u64 = 0;
const MAP_ANONYMOUS: u64 = 0x20;
const MAP_STACK: u64 = 0x20000;

/// What a piece of address space holds: whose it is and what kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MappedRegion {
    /// The mapping stack id (see `collect::mappings`) of the call that made it.
    pub stack_id: StackId,
    pub backing: Backing,
    /// PROT_NONE now.
    pub inaccessible: bool,
    /// Made with MAP_STACK: a thread stack, backed only where touched.
    pub thread_stack: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    Anonymous,
    File,
    Break,
}

impl MappedRegion {
    pub fn kind(&self) -> Kind {
        match self.backing {
            Backing::Break => Kind::HeapBrk,
            _ if self.inaccessible || self.thread_stack => Kind::MmapReserved,
            Backing::Anonymous => Kind::MmapAnon,
            Backing::File => Kind::MmapFile,
        }
    }
}

/// Whether an mmap call maps a file (not MAP_ANONYMOUS, with an fd).
pub fn maps_file(event: &MappingEvent) -> bool {
    event.flags & MAP_ANONYMOUS == 0 && event.fd as i64 >= 0
}

#[derive(Debug, Default)]
struct Process {
    ranges: RangeMap<MappedRegion>,
    /// The program break as last seen; None until the first brk call.
    program_break: Option<u64>,
}

/// Every traced process's mappings and the counters per stack and kind.
#[derive(Debug, Default)]
pub struct MappingLedger {
    processes: HashMap<u32, Process>,
    counters: HashMap<StackKey, Counters>,
}

/// A break that moves farther than this in one call is a new image's
/// break, not growth: no allocator grows its heap by 64 GiB at once, and a
/// new image's break lies anywhere (address randomization).
const BREAK_JUMP_BYTES: u64 = 64 << 30;

fn page_up(bytes: u64) -> u64 {
    bytes.saturating_add(PAGE_SIZE - 1) & !(PAGE_SIZE - 1)
}

impl MappingLedger {
    /// Counters of every stack that ever held a mapping kind.
    pub fn counters(&self) -> impl Iterator<Item = (StackKey, Counters)> + '_ {
        self.counters
            .iter()
            .map(|(key, counters)| (*key, *counters))
    }

    /// Live pieces of `pid`.
    pub fn pieces(&self, pid: u32) -> Vec<Piece<MappedRegion>> {
        self.processes
            .get(&pid)
            .map_or_else(Vec::new, |process| process.ranges.iter().collect())
    }

    /// The program break of `pid` as last seen, when known.
    pub fn program_break(&self, pid: u32) -> Option<u64> {
        self.processes
            .get(&pid)
            .and_then(|process| process.program_break)
    }

    /// The program break at attach (or after an exec), when known: growth
    /// from it counts. None (no heap yet, a new image): the next brk call
    /// sets it.
    pub fn set_program_break(&mut self, pid: u32, program_break: Option<u64>) {
        self.processes.entry(pid).or_default().program_break = program_break;
    }

    /// Applies one successful mapping call; `stack_id` names its stack.
    pub fn apply(&mut self, event: &MappingEvent, stack_id: StackId) {
        let pid = event.tgid;
        let added = event.in_allocator == 0;
        match event.call {
            mapping_call::MMAP => {
                let start = event.result;
                let end = start.saturating_add(page_up(event.length));
                self.remove(pid, start, end);
                if added {
                    let region = MappedRegion {
                        stack_id,
                        backing: if maps_file(event) {
                            Backing::File
                        } else {
                            Backing::Anonymous
                        },
                        inaccessible: event.prot == PROT_NONE,
                        thread_stack: event.flags & MAP_STACK != 0,
                    };
                    self.insert(pid, start, end, region, true);
                }
            }
            mapping_call::MUNMAP => {
                let end = event.address.saturating_add(page_up(event.length));
                self.remove(pid, event.address, end);
            }
            mapping_call::MREMAP => self.remap(event, added),
            mapping_call::BRK => self.move_break(event, stack_id, added),
            mapping_call::MPROTECT => self.protect(event),
            _ => {}
        }
    }

    fn remap(&mut self, event: &MappingEvent, added: bool) {
        let pid = event.tgid;
        let old_start = event.address;
        let old_length = page_up(event.length);
        let new_length = page_up(event.new_length);
        let new_start = event.result;
        let moved = if old_length == 0 {
            // Duplicates a shared mapping: the source stays.
            Vec::new()
        } else {
            self.remove(pid, old_start, old_start.saturating_add(old_length))
        };
        self.remove(pid, new_start, new_start.saturating_add(new_length));
        if !added {
            return;
        }
        let old_end = old_start + old_length;
        for piece in &moved {
            let offset = piece.start - old_start;
            if offset < new_length {
                let end = new_start + (piece.end - old_start).min(new_length);
                self.insert(pid, new_start + offset, end, piece.value, false);
            }
        }
        if new_length > old_length
            && let Some(last) = moved.iter().find(|piece| piece.end == old_end)
        {
            let grown = new_length - old_length;
            let start = new_start + old_length;
            self.insert(pid, start, start + grown, last.value, false);
            if let Some(counters) = self.counters.get_mut(&key(pid, &last.value)) {
                counters.alloc_bytes_total += grown;
            }
        }
    }

    fn move_break(&mut self, event: &MappingEvent, stack_id: StackId, added: bool) {
        let pid = event.tgid;
        let new_break = event.result;
        let old_break = self
            .processes
            .entry(pid)
            .or_default()
            .program_break
            .replace(new_break);
        let Some(old_break) = old_break else {
            return;
        };
        let (old_end, new_end) = (page_up(old_break), page_up(new_break));
        if old_end.abs_diff(new_end) > BREAK_JUMP_BYTES {
            // Not a move: a new image's break (after an exec, the loader's
            // first brk call reports it before tracer hears of the exec).
            return;
        }
        if new_end < old_end {
            self.remove(pid, new_end, old_end);
        } else if new_end > old_end && added {
            self.remove(pid, old_end, new_end);
            let region = MappedRegion {
                stack_id,
                backing: Backing::Break,
                inaccessible: false,
                thread_stack: false,
            };
            self.insert(pid, old_end, new_end, region, true);
        }
    }

    fn protect(&mut self, event: &MappingEvent) {
        let pid = event.tgid;
        let start = event.address;
        let end = start.saturating_add(page_up(event.length));
        let inaccessible = event.prot == PROT_NONE;
        let changes = self.processes.get(&pid).is_some_and(|process| {
            process
                .ranges
                .overlapping(start, end)
                .iter()
                .any(|piece| piece.value.inaccessible != inaccessible)
        });
        if !changes {
            return;
        }
        for piece in self.remove(pid, start, end) {
            let region = MappedRegion {
                inaccessible,
                ..piece.value
            };
            self.insert(pid, piece.start, piece.end, region, false);
        }
    }

    /// Empties `[start, end)` of `pid`; returns the removed parts.
    fn remove(&mut self, pid: u32, start: u64, end: u64) -> Vec<Piece<MappedRegion>> {
        let Some(process) = self.processes.get_mut(&pid) else {
            return Vec::new();
        };
        let removal = process.ranges.remove(start, end);
        for piece in &removal.taken {
            self.add(pid, piece, -1, false);
        }
        for piece in &removal.kept {
            self.add(pid, piece, 1, false);
        }
        removal.clipped(start, end)
    }

    /// Puts a piece into the empty `[start, end)`; `allocated` also counts
    /// it in the running totals (a new mapping, not a moved one).
    fn insert(&mut self, pid: u32, start: u64, end: u64, region: MappedRegion, allocated: bool) {
        if start >= end {
            return;
        }
        self.processes
            .entry(pid)
            .or_default()
            .ranges
            .insert_empty(start, end, region);
        let piece = Piece {
            start,
            end,
            value: region,
        };
        self.add(pid, &piece, 1, allocated);
    }

    fn add(&mut self, pid: u32, piece: &Piece<MappedRegion>, sign: i64, allocated: bool) {
        let counters = self.counters.entry(key(pid, &piece.value)).or_default();
        counters.live_bytes += sign * piece.length_bytes() as i64;
        counters.live_allocs += sign;
        if allocated {
            counters.alloc_bytes_total += piece.length_bytes();
            counters.alloc_count_total += 1;
        }
    }
}

fn key(pid: u32, region: &MappedRegion) -> StackKey {
    StackKey {
        pid,
        stack_id: region.stack_id,
        kind: region.kind(),
    }
}

#[cfg(test)]
mod tests;
