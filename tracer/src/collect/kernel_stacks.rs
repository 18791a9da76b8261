//! Frame-pointer stacks as the kernel walked them, checked. A walk through
//! code built without frame pointers reads whatever the frame register
//! holds as the next frame, and stack addresses or loop counters come out
//! as return addresses, a different one at every call: one leak then shows
//! as thousands of one-block stacks. Here a stack is cut at its first
//! return address outside the target's code and ends in an
//! `[unwinding stopped: ...]` frame, and stacks equal up to that point are
//! one stack: every kernel id is mapped to the first id with the same
//! checked frames.
//!
//! A stack the kernel's unwind walk took while one of its objects' tables
//! was still being built ends in `UNWIND_PENDING_FRAME`: it is kept as a
//! flag here (the report ends the stack in a marker frame) and counted.
use std::collections::{BTreeMap, HashMap, HashSet};

use crate::{attach::KernelMaps, procfs, unwind::StopReason};

/// A kernel stack, checked.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Checked {
    pid: u32,
    addresses: Vec<u64>,
    stopped: bool,
    /// Walked by frame pointers where a table was pending.
    pending: bool,
}

/// A canonical kernel stack, checked.
#[derive(Clone, Copy, Debug)]
pub struct CheckedStack<'a> {
    /// Return addresses (and the Python tag last, if any).
    pub addresses: &'a [u64],
    /// Cut at a return address outside the target's code.
    pub stopped: bool,
    /// Taken before one of its objects' unwind tables was ready.
    pub pending: bool,
}

#[derive(Default)]
pub struct KernelStacks {
    /// The id standing for each (process, kernel id).
    canonical: HashMap<(u32, u32), u32>,
    /// The first id of each checked stack.
    first_id: HashMap<Checked, u32>,
    /// Each canonical stack, checked, by (process, id).
    stacks: HashMap<(u32, u32), Checked>,
    /// Each process's executable ranges, as last read.
    code: HashMap<u32, Vec<(u64, u64)>>,
    /// Stacks cut short, by reason.
    stops: BTreeMap<StopReason, u64>,
    /// Distinct stacks taken before one of their tables was ready.
    pending: u64,
    /// The processes whose code was read again in this pass.
    reread: HashSet<u32>,
}

impl KernelStacks {
    /// The id that stands for kernel stack `id` of `pid`: its own, or that
    /// of the first stack with the same checked frames.
    pub fn canonical(&mut self, pid: u32, id: u32, maps: &KernelMaps<'_>) -> u32 {
        if let Some(&canonical) = self.canonical.get(&(pid, id)) {
            return canonical;
        }
        let checked = self.check(pid, maps.stack(id));
        let canonical = *self.first_id.entry(checked.clone()).or_insert(id);
        if canonical == id {
            if checked.stopped {
                *self.stops.entry(StopReason::OutsideCode).or_default() += 1;
            }
            if checked.pending {
                self.pending += 1;
            }
            self.stacks.insert((pid, id), checked);
        }
        self.canonical.insert((pid, id), canonical);
        canonical
    }

    /// Starts a pass over the stacks the kernel holds now (call it before
    /// reading BY_STACK): each process's code is read again at most once
    /// per pass. Every stack of the pass was taken before it started, so
    /// one read after a stack outside the code known covers the libraries
    /// any of them could be in. Reading /proc/PID/maps of a torch process
    /// (2 000 mappings) for each new stack with a junk frame took 90 % of
    /// tracer's CPU.
    pub fn new_pass(&mut self) {
        self.reread.clear();
    }

    /// A canonical stack, checked.
    pub fn addresses(&self, pid: u32, id: u32) -> Option<CheckedStack<'_>> {
        let checked = self.stacks.get(&(pid, id))?;
        Some(CheckedStack {
            addresses: &checked.addresses,
            stopped: checked.stopped,
            pending: checked.pending,
        })
    }

    /// Distinct stacks taken before one of their objects' unwind tables
    /// was ready.
    pub fn pending(&self) -> u64 {
        self.pending
    }

    /// Distinct stacks cut short, by reason.
    pub fn stops(&self) -> &BTreeMap<StopReason, u64> {
        &self.stops
    }

    fn check(&mut self, pid: u32, mut addresses: Vec<u64>) -> Checked {
        // The Python stack's tag (the last frame) is no return address.
        let python = addresses.pop_if(|last| tracer_ebpf::python_stack_of_frame(*last).is_some());
        let pending = addresses
            .pop_if(|last| *last == tracer_ebpf::UNWIND_PENDING_FRAME)
            .is_some();
        let mut outside = self.first_outside_code(pid, &addresses);
        if outside.is_some() && self.reread.insert(pid) {
            // A library mapped since, or a new image (exec): read the
            // process's code again, once per pass.
            self.code.insert(pid, procfs::executable_ranges(pid));
            outside = self.first_outside_code(pid, &addresses);
        }
        if let Some(first) = outside {
            addresses.truncate(first);
        }
        addresses.extend(python);
        Checked {
            pid,
            addresses,
            stopped: outside.is_some(),
            pending,
        }
    }

    /// The index of the first address outside `pid`'s code as last read
    /// (none when the process is gone and nothing can be checked).
    fn first_outside_code(&mut self, pid: u32, addresses: &[u64]) -> Option<usize> {
        let ranges = self
            .code
            .entry(pid)
            .or_insert_with(|| procfs::executable_ranges(pid));
        if ranges.is_empty() {
            return None;
        }
        addresses.iter().position(|&address| {
            !ranges
                .iter()
                .any(|&(start, end)| (start..end).contains(&address))
        })
    }
}
