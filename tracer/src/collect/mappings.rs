//! The targets' mapping calls: drained from the kernel's MAPPING_EVENTS
//! ring buffer (the kernel never wakes tracer for them; `collect` drains on
//! a timer), applied to the model's `MappingLedger`, and the stacks they
//! were made from.
//!
//! A mapping stack is the kernel's user stack plus what the kernel cannot
//! know: the caller of a leaf syscall wrapper (glibc's `mmap` and `syscall`
//! keep no frame, so the frame-pointer walk skips the function that called
//! them; the word at the stack pointer is its return address) and, for a
//! file mapping, the file. Each distinct one is numbered here:
//! `StackId::Mapping`.
use std::collections::HashMap;

use aya::maps::{MapData, RingBuf};
use tracer_ebpf::{MappingEvent, NO_STACK, advice, is_copied_stack, mapping_call};

use super::{
    copied::CopiedStacks,
    huge_pages::{HUGE_PAGE_BYTES, HugePages},
};
use crate::{
    model::{
        Counters, Frame, StackId, StackKey,
        mappings::{MappingLedger, maps_file},
        resident::ResidentLedger,
    },
    procfs,
    symbolize::Symbols,
};

/// Drains a write fault whose page is not mapped yet is asked about
/// again (a drain every 20 ms: 100 ms).
const UNSETTLED_DRAINS: u8 = 5;

/// Syscall wrappers that keep no frame of their own (glibc's): the word at
/// the stack pointer in them is the return address into their caller.
const LEAF_WRAPPERS: [&str; 5] = ["mmap", "mmap64", "syscall", "brk", "munmap"];

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct MappingStack {
    pid: u32,
    code_stack: CodeStack,
    caller_address: u64,
    /// The mapped file, for file mappings.
    file: Option<String>,
}

/// The code's stack of a mapping call.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum CodeStack {
    /// Walked by the kernel: its frames as STACKS had them when the event
    /// was drained (the kernel may hand the id to other frames later).
    Walked(Vec<u64>),
    /// Unwound from a copy: `StackId::Copied`.
    Copied(StackId),
    Lost,
}

pub struct MappingTracker {
    events: RingBuf<MapData>,
    ledger: MappingLedger,
    /// `--resident`: the pages charged to the faults' stacks, and which
    /// faults huge pages served.
    resident: Option<(ResidentLedger, HugePages)>,
    /// Write faults whose page was not in the page table yet when their
    /// event was read: asked again at the next drains (pid, address,
    /// drains left).
    unsettled: Vec<(u32, u64, u8)>,
    /// Fault events that charged a page since `sampled_since`.
    sampled_faults: u64,
    sampled_since: std::time::Instant,
    stacks: Vec<MappingStack>,
    stack_ids: HashMap<MappingStack, StackId>,
}

impl MappingTracker {
    pub fn new(events: RingBuf<MapData>, resident: bool) -> Self {
        MappingTracker {
            events,
            ledger: MappingLedger::default(),
            resident: resident.then(|| (ResidentLedger::default(), HugePages::new())),
            unsettled: Vec::new(),
            sampled_faults: 0,
            sampled_since: std::time::Instant::now(),
            stacks: Vec::new(),
            stack_ids: HashMap::new(),
        }
    }

    /// Starts following `pid` (again, after an exec): growth of its break
    /// from now on counts; the pages of an image it replaced are gone.
    pub fn start(&mut self, pid: u32) {
        self.ledger
            .set_program_break(pid, procfs::program_break(pid));
        if let Some((resident, huge)) = &mut self.resident {
            resident.forget(pid);
            huge.forget(pid);
        }
    }

    /// Applies every event the kernel sent since the last drain; the
    /// stacks copied at mapping calls come from `copied`, those the kernel
    /// walked from `read_stack` (the frames of a STACKS id).
    pub fn drain(
        &mut self,
        copied: &mut CopiedStacks,
        read_stack: &mut dyn FnMut(u32) -> Vec<u64>,
    ) {
        let mut events: Vec<MappingEvent> = Vec::new();
        while let Some(item) = self.events.next() {
            if item.len() >= size_of::<MappingEvent>() {
                // SAFETY: the item holds a whole MappingEvent, plain integers.
                events.push(unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) });
            }
        }
        copied.drain();
        self.settle_huge_pages();
        let mut flushed = false;
        // With --resident: the stacks the faults of this drain walked, by
        // their kernel id (one id names one stack until the next eviction,
        // after the drain): one read of each.
        let mut walked: HashMap<u32, StackId> = HashMap::new();
        for mut event in events {
            if self.resident.is_some() {
                self.apply_resident(&mut event, copied, &mut flushed, read_stack, &mut walked);
                // The mappings' own kinds are not counted then: only the
                // program break is followed (what a shrinking one gives
                // back), with no stack.
                if event.call == mapping_call::BRK {
                    self.ledger.apply(&event, StackId::Lost);
                }
                continue;
            }
            let adds = matches!(event.call, mapping_call::MMAP | mapping_call::BRK)
                && event.in_allocator == 0;
            let stack_id = if adds {
                self.stack_id(&event, code_stack(&event, copied, &mut flushed, read_stack))
            } else {
                StackId::Lost
            };
            self.ledger.apply(&event, stack_id);
        }
    }

    /// What one event changes in the resident pages (`--resident`),
    /// before the mapping ledger applies it (a shrinking break is told by
    /// the break it had). A fault's stack is read only when it charges a
    /// page.
    fn apply_resident(
        &mut self,
        event: &mut MappingEvent,
        copied: &mut CopiedStacks,
        flushed: &mut bool,
        read_stack: &mut dyn FnMut(u32) -> Vec<u64>,
        walked: &mut HashMap<u32, StackId>,
    ) {
        let Some((resident, huge)) = &mut self.resident else {
            return;
        };
        let pid = event.tgid;
        let given_back = match event.call {
            mapping_call::FAULT => {
                if resident.is_charged(pid, event.address) {
                    // The stack is not needed: a copied one is dropped
                    // with the others not taken.
                    return;
                }
                // The word at the stack pointer means nothing at a fault.
                event.caller_address = 0;
                let kernel_id = (event.stack_id != NO_STACK && !is_copied_stack(event.stack_id))
                    .then_some(event.stack_id);
                let stack_id = match kernel_id.and_then(|id| walked.get(&id)) {
                    Some(&stack_id) => stack_id,
                    None => {
                        let stack = code_stack(event, copied, flushed, read_stack);
                        let stack_id = self.stack_id(event, stack);
                        if let Some(id) = kernel_id {
                            walked.insert(id, stack_id);
                        }
                        stack_id
                    }
                };
                let Some((resident, huge)) = &mut self.resident else {
                    return;
                };
                resident.fault(pid, event.address, stack_id, event.new_length.min(63) as u8);
                self.sampled_faults += 1;
                if event.prot == 1 {
                    match huge.served_by_huge_page(pid, event.address) {
                        Some(true) => resident.huge_fault(pid, event.address, HUGE_PAGE_BYTES),
                        Some(false) => {}
                        None => self.unsettled.push((pid, event.address, UNSETTLED_DRAINS)),
                    }
                }
                return;
            }
            mapping_call::MADVISE if advice::GIVES_BACK.contains(&event.prot) => {
                Some((event.address, event.length))
            }
            mapping_call::MADVISE
                if event.prot == advice::HUGEPAGE || event.prot == advice::NOHUGEPAGE =>
            {
                let end = event.address.saturating_add(event.length);
                huge.advise(pid, event.address, end, event.prot == advice::HUGEPAGE);
                None
            }
            mapping_call::MUNMAP => Some((event.address, event.length)),
            // A new mapping replaces whatever was there (MAP_FIXED).
            mapping_call::MMAP => Some((event.result, event.length)),
            mapping_call::MREMAP => {
                resident.remap(
                    pid,
                    event.address,
                    event.length,
                    event.result,
                    event.new_length,
                );
                huge.release(
                    pid,
                    event.address,
                    event.address.saturating_add(event.length),
                );
                None
            }
            mapping_call::BRK => self
                .ledger
                .program_break(pid)
                .filter(|&old_break| event.result < old_break)
                .map(|old_break| (event.result, old_break - event.result)),
            _ => None,
        };
        if let Some((start, length)) = given_back {
            let end = start.saturating_add(length);
            resident.release(pid, start, end);
            huge.release(pid, start, end);
        }
    }

    /// Asks again about the write faults whose page was not mapped yet;
    /// one still unmapped after `UNSETTLED_DRAINS` drains was given back
    /// meanwhile, or never made resident.
    fn settle_huge_pages(&mut self) {
        let Some((resident, huge)) = &mut self.resident else {
            return;
        };
        self.unsettled.retain_mut(|(pid, address, left)| {
            if !resident.is_charged(*pid, *address) {
                return false;
            }
            match huge.served_by_huge_page(*pid, *address) {
                Some(true) => {
                    resident.huge_fault(*pid, *address, HUGE_PAGE_BYTES);
                    false
                }
                Some(false) => false,
                None => {
                    *left -= 1;
                    *left > 0
                }
            }
        });
    }

    /// The fault events that charged a page since the last call
    /// (`--resident`), and their rate a second.
    pub fn take_fault_rate(&mut self) -> (u64, f64) {
        let seconds = self.sampled_since.elapsed().as_secs_f64().max(1e-3);
        self.sampled_since = std::time::Instant::now();
        let faults = std::mem::take(&mut self.sampled_faults);
        (faults, faults as f64 / seconds)
    }

    /// Faults found served by a transparent huge page (`--resident`).
    pub fn huge_page_faults(&self) -> u64 {
        self.resident.as_ref().map_or(0, |(_, huge)| huge.found)
    }

    /// Counters of every stack that held a mapping kind, or with
    /// `--resident` resident pages.
    pub fn counters(&self) -> Box<dyn Iterator<Item = (StackKey, Counters)> + '_> {
        match &self.resident {
            Some((resident, _)) => Box::new(resident.counters()),
            None => Box::new(self.ledger.counters()),
        }
    }

    /// The Python stack ids the walked stacks of mapping calls carry: the
    /// kernel keeps them (`stack_table`).
    pub fn stored_stacks(&self) -> impl Iterator<Item = u32> + '_ {
        self.stacks
            .iter()
            .filter_map(|stack| match &stack.code_stack {
                CodeStack::Walked(addresses) => crate::runtimes::stored_stack_tag(addresses),
                CodeStack::Copied(_) | CodeStack::Lost => None,
            })
    }

    fn stack_id(&mut self, event: &MappingEvent, code_stack: CodeStack) -> StackId {
        let file = (event.call == mapping_call::MMAP && maps_file(event))
            .then(|| mapped_file(event.tgid, event.result, event.fd));
        let stack = MappingStack {
            pid: event.tgid,
            code_stack,
            caller_address: event.caller_address,
            file,
        };
        if let Some(&id) = self.stack_ids.get(&stack) {
            return id;
        }
        let id = StackId::Mapping(self.stacks.len() as u32);
        self.stacks.push(stack.clone());
        self.stack_ids.insert(stack, id);
        id
    }

    /// The frames of the mapping stack `index`, innermost first: the
    /// mapped file (as a frame named `mmap-file`), then the code, whose
    /// return addresses `copied` gives for a copied stack.
    pub fn frames(
        &self,
        index: u32,
        symbols: &mut Symbols,
        copied: impl Fn(StackId) -> Vec<u64>,
    ) -> Vec<Frame> {
        let Some(stack) = self.stacks.get(index as usize) else {
            return Vec::new();
        };
        let mut frames = Vec::new();
        if let Some(file) = &stack.file {
            frames.push(Frame {
                function: Some("mmap-file".to_owned()),
                file: Some(file.clone()),
                ..Frame::default()
            });
        }
        let addresses = match &stack.code_stack {
            CodeStack::Walked(addresses) => addresses.clone(),
            CodeStack::Copied(copied_stack) => copied(*copied_stack),
            CodeStack::Lost => Vec::new(),
        };
        let Some((&innermost, outer)) = addresses.split_first() else {
            return frames;
        };
        let innermost_frames = symbols.stack_frames(stack.pid, &[innermost]);
        let in_leaf_wrapper = innermost_frames
            .first()
            .and_then(|frame| frame.function.as_deref())
            .is_some_and(is_leaf_wrapper);
        // Unwound from a copy, or walked in the kernel through the
        // wrapper's table (the kernel reads the word at the stack pointer
        // only for frame-pointer walks).
        let unwound = matches!(stack.code_stack, CodeStack::Copied(_)) || stack.caller_address == 0;
        if in_leaf_wrapper && stack.caller_address != 0 {
            frames.extend(symbols.stack_frames(stack.pid, &[stack.caller_address]));
        } else if !(in_leaf_wrapper && unwound) {
            // An unwound stack goes on with the wrapper's caller itself.
            frames.extend(innermost_frames);
        }
        frames.extend(symbols.stack_frames(stack.pid, outer));
        frames
    }
}

/// The code's stack of a mapping call: the kernel's, or, when its stack
/// was copied (`--unwind copy`), the unwound one. The copy went into its
/// ring at the call's entry, before the event at its exit: one flush (once
/// per drain of the events) finds a copy not read yet.
fn code_stack(
    event: &MappingEvent,
    copied: &mut CopiedStacks,
    flushed: &mut bool,
    read_stack: &mut dyn FnMut(u32) -> Vec<u64>,
) -> CodeStack {
    if event.stack_id == NO_STACK {
        return CodeStack::Lost;
    }
    if !is_copied_stack(event.stack_id) {
        return CodeStack::Walked(read_stack(event.stack_id));
    }
    copied
        .take_mapping_stack(event.tgid, event.stack_id)
        .or_else(|| {
            if !*flushed {
                copied.flush();
                *flushed = true;
            }
            copied.take_mapping_stack(event.tgid, event.stack_id)
        })
        .map_or(CodeStack::Lost, CodeStack::Copied)
}

fn is_leaf_wrapper(function: &str) -> bool {
    let name = function.strip_prefix("__GI_").unwrap_or(function);
    LEAF_WRAPPERS.contains(&name.trim_start_matches('_'))
}

/// The file mapped at `address`: from /proc/PID/maps while the mapping
/// lives, else from the descriptor while it is open.
fn mapped_file(pid: u32, address: u64, fd: u64) -> String {
    procfs::read_maps(pid)
        .ok()
        .and_then(|maps| {
            maps.into_iter()
                .find(|mapping| mapping.contains(address))
                .map(|mapping| mapping.path.display().to_string())
        })
        .or_else(|| {
            std::fs::read_link(format!("/proc/{pid}/fd/{fd}"))
                .ok()
                .map(|path| path.display().to_string())
        })
        .unwrap_or_else(|| "(unknown file)".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognizes_glibc_leaf_wrappers() {
        for name in [
            "mmap64",
            "__GI___mmap64",
            "__mmap",
            "syscall",
            "__brk",
            "munmap",
        ] {
            assert!(is_leaf_wrapper(name), "{name}");
        }
        for name in ["mremap", "leak_mapping", "mmap_region"] {
            assert!(!is_leaf_wrapper(name), "{name}");
        }
    }
}
