//! Stacks the kernel walked (STACKS), checked and named by their frames.
//!
//! A walk through code built without frame pointers reads whatever the
//! frame register holds as the next frame, and stack addresses or loop
//! counters come out as return addresses, a different one at every call:
//! one leak then shows as thousands of one-block stacks. Here a stack is
//! cut at its first return address outside the target's code and ends in
//! an `[unwinding stopped: ...]` frame, and stacks equal up to that point
//! are one stack.
//!
//! Each distinct checked stack of a process gets a name, the number of
//! `StackId::Kernel` that the model, reports and recordings carry. A name
//! is never given to other frames in a run, whereas a kernel id is: the
//! kernel's table is bounded (`stack_table`), and a stack it evicted gets a
//! new id when it is walked again. Every kernel id of the same frames
//! (one walked again, or two walks equal once checked) is an incarnation
//! of one name, and the totals of the incarnations evicted are folded into
//! the name's, so its counters stay those of every block it ever made.
//!
//! A name whose incarnations were all evicted holds nothing; it is kept
//! (a stack walked again then joins it) until the model has folded it
//! (`Model::take_folded`), then forgotten with its frames.
//!
//! A stack the kernel's unwind walk took while one of its objects' tables
//! was still being built ends in `UNWIND_PENDING_FRAME`: it is kept as a
//! flag here (the report ends the stack in a marker frame) and counted.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use crate::{
    model::{Counters, Kind},
    procfs,
    runtimes::{is_stored_stack_tag, stored_stack_tag},
    unwind::UnwindStop,
};

/// A kernel stack, checked.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Checked {
    pid: u32,
    addresses: Vec<u64>,
    stopped: bool,
    /// Walked by frame pointers where a table was pending.
    pending: bool,
}

/// A named kernel stack, checked.
#[derive(Clone, Copy, Debug)]
pub struct CheckedStack<'a> {
    /// Return addresses (and the Python tag last, if any).
    pub addresses: &'a [u64],
    /// Cut at a return address outside the target's code.
    pub stopped: bool,
    /// Taken before one of its objects' unwind tables was ready.
    pub pending: bool,
}

/// One name: its frames, how many kernel ids stand for it now, and the
/// totals of those evicted.
struct Named {
    checked: Arc<Checked>,
    incarnations: u32,
    folded: Vec<(Kind, Counters)>,
}

#[derive(Default)]
pub struct KernelStacks {
    /// The name of each (process, kernel id) held.
    names: HashMap<(u32, u32), u32>,
    /// The name of each checked stack.
    by_frames: HashMap<Arc<Checked>, u32>,
    named: HashMap<u32, Named>,
    next_name: u32,
    /// Names that lost their last incarnation since the last call of
    /// `take_dead`.
    dead: Vec<u32>,
    /// How many names carry each stored stack id in their frames.
    stored_refs: HashMap<u32, u32>,
    /// Each process's executable ranges, as last read.
    code: HashMap<u32, Vec<(u64, u64)>>,
    /// Stacks cut short, by reason.
    stops: BTreeMap<UnwindStop, u64>,
    /// Distinct stacks taken before one of their tables was ready.
    pending: u64,
    /// The processes whose code was read again in this pass.
    reread: HashSet<u32>,
}

/// Names are below this: raw numbers from it up are mapping and copied
/// stacks (`StackId::to_raw`).
const MAX_NAMES: u32 = 1 << 31;

impl KernelStacks {
    /// The name of kernel stack `id` of `pid`, None once names ran out
    /// (2^31 distinct stacks in one run). `frames` reads the id's frames
    /// when the pair is new.
    pub fn name(&mut self, pid: u32, id: u32, frames: impl FnOnce() -> Vec<u64>) -> Option<u32> {
        if let Some(&name) = self.names.get(&(pid, id)) {
            return Some(name);
        }
        let checked = self.check(pid, frames());
        let name = match self.by_frames.get(&checked) {
            Some(&name) => name,
            None => {
                if self.next_name >= MAX_NAMES {
                    return None;
                }
                let name = self.next_name;
                self.next_name += 1;
                if checked.stopped {
                    *self.stops.entry(UnwindStop::OutsideCode).or_default() += 1;
                }
                if checked.pending {
                    self.pending += 1;
                }
                if let Some(stored) = stored_stack_tag(&checked.addresses) {
                    *self.stored_refs.entry(stored).or_default() += 1;
                }
                let checked = Arc::new(checked);
                self.by_frames.insert(Arc::clone(&checked), name);
                self.named.insert(
                    name,
                    Named {
                        checked,
                        incarnations: 0,
                        folded: Vec::new(),
                    },
                );
                name
            }
        };
        self.named
            .get_mut(&name)
            .expect("a name has its frames")
            .incarnations += 1;
        self.names.insert((pid, id), name);
        Some(name)
    }

    /// The name `id` of `pid` stands for, when the pair is held.
    pub fn name_of(&self, pid: u32, id: u32) -> Option<u32> {
        self.names.get(&(pid, id)).copied()
    }

    /// Adds the last totals of an incarnation evicted to its name's.
    pub fn fold(&mut self, name: u32, kind: Kind, counters: Counters) {
        let Some(named) = self.named.get_mut(&name) else {
            return;
        };
        match named.folded.iter_mut().find(|(known, _)| *known == kind) {
            Some((_, folded)) => *folded = folded.plus(counters),
            None => named.folded.push((kind, counters)),
        }
    }

    /// `id` of `pid` was evicted: its name has one incarnation less (dead
    /// with none left; see `take_dead`).
    pub fn evicted(&mut self, pid: u32, id: u32) {
        let Some(name) = self.names.remove(&(pid, id)) else {
            return;
        };
        if let Some(named) = self.named.get_mut(&name) {
            named.incarnations -= 1;
            if named.incarnations == 0 {
                self.dead.push(name);
            }
        }
    }

    /// The names that lost their last incarnation since the last call and
    /// still have none, with their process and the kinds they counted.
    pub fn take_dead(&mut self) -> Vec<(u32, u32, Vec<Kind>)> {
        let dead = std::mem::take(&mut self.dead);
        dead.into_iter()
            .filter_map(|name| {
                let named = self.named.get(&name)?;
                (named.incarnations == 0).then(|| {
                    let kinds = named.folded.iter().map(|(kind, _)| *kind).collect();
                    (named.checked.pid, name, kinds)
                })
            })
            .collect()
    }

    /// Forgets a name with no incarnation (the model folded it): its
    /// frames go. A name that is held again is kept.
    pub fn forget(&mut self, name: u32) {
        let Some(named) = self.named.get(&name) else {
            return;
        };
        if named.incarnations > 0 {
            return;
        }
        let named = self.named.remove(&name).expect("just seen");
        if self.by_frames.get(&named.checked) == Some(&name) {
            self.by_frames.remove(&named.checked);
        }
        if let Some(stored) = stored_stack_tag(&named.checked.addresses)
            && let Some(refs) = self.stored_refs.get_mut(&stored)
        {
            *refs -= 1;
            if *refs == 0 {
                self.stored_refs.remove(&stored);
            }
        }
    }

    /// Forgets every name of a process that exited (`--comm`).
    pub fn forget_process(&mut self, pid: u32) {
        self.names.retain(|(name_pid, _), _| *name_pid != pid);
        let names: Vec<u32> = self
            .named
            .iter()
            .filter(|(_, named)| named.checked.pid == pid)
            .map(|(&name, _)| name)
            .collect();
        for name in names {
            if let Some(named) = self.named.get_mut(&name) {
                named.incarnations = 0;
            }
            self.forget(name);
        }
        self.code.remove(&pid);
    }

    /// Whether a name's frames carry stored stack `id`.
    pub fn names_stored_stack(&self, id: u32) -> bool {
        self.stored_refs.contains_key(&id)
    }

    /// The totals folded into the names that are held, by process, name and
    /// kind: the snapshot adds them to those of their incarnations.
    pub fn folded(&self) -> impl Iterator<Item = (u32, u32, Kind, Counters)> + '_ {
        self.named
            .iter()
            .filter(|(_, named)| named.incarnations > 0)
            .flat_map(|(&name, named)| {
                named
                    .folded
                    .iter()
                    .map(move |&(kind, counters)| (named.checked.pid, name, kind, counters))
            })
    }

    /// Names with frames, and (process, kernel id) pairs held.
    pub fn counts(&self) -> (usize, usize) {
        (self.named.len(), self.names.len())
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

    /// A named stack, checked.
    pub fn addresses(&self, name: u32) -> Option<CheckedStack<'_>> {
        let checked = &self.named.get(&name)?.checked;
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
    pub fn stops(&self) -> &BTreeMap<UnwindStop, u64> {
        &self.stops
    }

    fn check(&mut self, pid: u32, mut addresses: Vec<u64>) -> Checked {
        // The stored stack's tag (the last frame) is no return address.
        let stored = addresses.pop_if(|last| is_stored_stack_tag(*last));
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
        addresses.extend(stored);
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
