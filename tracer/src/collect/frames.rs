//! The frames of the stacks the collector saw, read from wherever each
//! kind of stack is kept and symbolized once; and what the report says of
//! them: whether each reaches its thread's start, where unwinding stopped.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use super::Collector;
use crate::{
    model::{
        Frame, StackId, StackKey,
        quality::{is_thread_entry, python_reaches_start},
    },
    unwind::UnwindStop,
};

/// The outermost frame of a stack the kernel walked by frame pointers
/// through an object whose unwind table was still being built: its frames
/// past that object's may be wrong or missing.
pub const TABLE_PENDING_MARKER: &str = "[unwind table pending: walked by frame pointers]";

/// Symbolized stacks, each frame stored once however many stacks share
/// it: a process with deep stacks (torch's Python frames under its C++
/// ones) holds up to 100 000 distinct stacks of 100-200 frames, whose
/// names, files, module paths and build ids copied per stack took GiBs.
#[derive(Default)]
pub(super) struct Interned {
    stacks: HashMap<StackKey, Vec<Arc<Frame>>>,
    frames: HashSet<Arc<Frame>>,
    /// Stacks forgotten since the frames were last pruned.
    forgotten: usize,
}

impl Interned {
    fn get(&self, key: &StackKey) -> Option<&[Arc<Frame>]> {
        self.stacks.get(key).map(Vec::as_slice)
    }

    /// `frames`, each as its one shared copy. Collected into a new vector
    /// of its own length: `into_iter().map().collect()` reuses the
    /// `Vec<Frame>`'s buffer in place, 20 times the size of the
    /// `Arc`s it then holds, so each stack kept ~23 KiB for ~1 KiB of
    /// pointers (150 MiB at the end of a 20 s torch run).
    fn intern(&mut self, frames: Vec<Frame>) -> Vec<Arc<Frame>> {
        let mut shared = Vec::with_capacity(frames.len());
        shared.extend(
            frames
                .into_iter()
                .map(|frame| match self.frames.get(&frame) {
                    Some(known) => Arc::clone(known),
                    None => {
                        let frame = Arc::new(frame);
                        self.frames.insert(Arc::clone(&frame));
                        frame
                    }
                }),
        );
        shared
    }

    /// Forgets the stacks of a process that exited; the frames only it
    /// had go with them.
    pub(super) fn forget(&mut self, pid: u32) {
        self.stacks.retain(|key, _| key.pid != pid);
        self.prune();
    }

    /// Forgets one stack (folded by the model). The frames no stack has
    /// any more go once as many stacks went as there are frames kept, so
    /// that the sweep costs a constant per stack.
    pub(super) fn forget_stack(&mut self, key: &StackKey) {
        if self.stacks.remove(key).is_some() {
            self.forgotten += 1;
            if self.forgotten >= self.frames.len() {
                self.prune();
            }
        }
    }

    fn prune(&mut self) {
        self.frames.retain(|frame| Arc::strong_count(frame) > 1);
        self.forgotten = 0;
    }
}

impl Collector {
    /// The CUDA function that made a GPU stack's memory.
    pub fn api(&self, key: &StackKey) -> Option<&'static str> {
        self.stacks.apis.get(key).copied()
    }

    /// The symbolized frames of a stack, innermost first (empty when the
    /// kernel could not store it). Each stack is read and symbolized once;
    /// frames outside every known object are tried again later.
    pub fn frames(&mut self, key: &StackKey) -> Vec<Frame> {
        self.shared_frames(key)
            .iter()
            .map(|frame| Frame::clone(frame))
            .collect()
    }

    /// [`Collector::frames`] as shared copies: what a caller holding the
    /// frames of many stacks at once (the report) keeps.
    pub fn shared_frames(&mut self, key: &StackKey) -> Vec<Arc<Frame>> {
        if let Some(frames) = self.stacks.frames.get(key) {
            return frames.to_vec();
        }
        let mut pending = false;
        let deferred = self.stacks.symbols.deferred();
        let frames = match key.stack_id {
            StackId::Lost => Vec::new(),
            StackId::Kernel(name) => match self.stacks.kernel.addresses(name) {
                Some(stack) => {
                    let mut frames = self.stacks.symbols.stack_frames(key.pid, stack.addresses);
                    if stack.stopped {
                        frames.push(Frame {
                            function: Some(UnwindStop::OutsideCode.marker()),
                            ..Frame::default()
                        });
                    }
                    pending = stack.pending;
                    frames
                }
                None => Vec::new(),
            },
            StackId::Copied(index) => self
                .stacks
                .copied
                .frames(index, &mut self.stacks.symbols)
                .unwrap_or_default(),
            StackId::Mapping(index) => {
                let copied = &self.stacks.copied;
                self.mappings.frames(
                    index,
                    &mut self.stacks.symbols,
                    |code_stack| match code_stack {
                        StackId::Copied(index) => copied.addresses(index).to_vec(),
                        StackId::Kernel(_) | StackId::Mapping(_) | StackId::Lost => Vec::new(),
                    },
                )
            }
        };
        let mut frames = self.merge_stored(key.pid, frames);
        if pending {
            // Outermost: the frames above are the kernel's frame-pointer
            // walk of code whose table was not built yet.
            frames.push(Frame {
                function: Some(TABLE_PENDING_MARKER.to_owned()),
                ..Frame::default()
            });
        }
        // A frame the symbolizer was late for is named next time.
        let complete = self.stacks.symbols.deferred() == deferred
            && frames
                .iter()
                .all(|frame| frame.module.is_some() || frame.address == 0);
        let frames = self.stacks.frames.intern(frames);
        if complete {
            self.stacks.frames.stacks.insert(*key, frames.clone());
        }
        frames
    }

    /// Waits for the symbolizer to answer what it was asked, `bound` at
    /// most (the final report's wait: [`crate::symbolize::FINAL_WAIT_FOR_SYMBOLS`]).
    pub fn settle_symbols(&mut self, bound: std::time::Duration) {
        self.stacks.symbols.settle(bound);
    }

    /// Addresses the symbolizer has not answered yet: their frames show
    /// their module and offset only.
    pub fn unanswered_symbols(&self) -> usize {
        self.stacks.symbols.unanswered()
    }

    /// Whether a stack reaches its thread's start (`model::quality`):
    /// only its outermost frame is symbolized, unless it was already.
    pub fn reaches_entry(&mut self, key: &StackKey) -> bool {
        if let Some(frames) = self.stacks.frames.get(key) {
            // A stack walked while a table was pending reaches its start
            // when the frame before its marker is the start.
            let outermost = match frames.split_last() {
                Some((last, rest)) if last.function.as_deref() == Some(TABLE_PENDING_MARKER) => {
                    rest.last()
                }
                other => other.map(|(last, _)| last),
            };
            return outermost.is_some_and(|frame| is_thread_entry(frame))
                || python_reaches_start(frames);
        }
        // A runtime's stack is whole from where the runtime started it,
        // wherever its native frames stop.
        if self.runtimes.stored_stacks().runs_in(key.pid) && self.stored_reaches_start(key) {
            return true;
        }
        let addresses = match key.stack_id {
            StackId::Lost => return false,
            StackId::Kernel(name) => match self.stacks.kernel.addresses(name) {
                Some(stack) if stack.stopped => return false,
                Some(stack) => stack.addresses.to_vec(),
                None => return false,
            },
            StackId::Copied(index) if self.stacks.copied.ends_early(index) => return false,
            StackId::Copied(index) => self.stacks.copied.addresses(index).to_vec(),
            StackId::Mapping(_) => return self.frames(key).last().is_some_and(is_thread_entry),
        };
        let addresses = crate::runtimes::without_stored_tag(addresses);
        let Some(&outermost) = addresses.last() else {
            return false;
        };
        if let Some(&known) = self.stacks.thread_entries.get(&(key.pid, outermost)) {
            return known;
        }
        // The address before it, so that the last one is symbolized as a
        // return address.
        let tail = &addresses[addresses.len().saturating_sub(2)..];
        let deferred = self.stacks.symbols.deferred();
        let reaches = self
            .stacks
            .symbols
            .stack_frames(key.pid, tail)
            .last()
            .is_some_and(is_thread_entry);
        if self.stacks.symbols.deferred() == deferred {
            self.stacks
                .thread_entries
                .insert((key.pid, outermost), reaches);
        }
        reaches
    }

    /// Whether a stack's runtime frames reach where the runtime started it
    /// (`python_reaches_start` of its frames): read from its stored stack
    /// alone for a kernel stack, without symbolizing its native frames
    /// (the outermost runtime frame of the merged stack is the stored
    /// stack's, or the marker of one cut or unknown).
    fn stored_reaches_start(&mut self, key: &StackKey) -> bool {
        let StackId::Kernel(name) = key.stack_id else {
            return python_reaches_start(&self.frames(key));
        };
        let Some(stored) = self
            .stacks
            .kernel
            .addresses(name)
            .and_then(|stack| crate::runtimes::stored_stack_tag(stack.addresses))
        else {
            return false;
        };
        if !self.runtimes.stored_stacks().knows(key.pid, stored) {
            self.stacks.table.resolve_stored(
                &mut self.probes.stack_maps(),
                self.runtimes.stored_stacks(),
                key.pid,
                stored,
            );
        }
        self.runtimes
            .stored_stacks()
            .reaches_start(key.pid, stored)
            .unwrap_or(false)
    }

    /// Stacks whose unwinding stopped early, by reason: copies unwound
    /// here, and distinct frame-pointer stacks (`frame_pointers_...`).
    pub fn unwinding_stops(&self) -> BTreeMap<String, u64> {
        let mut stops = self.stacks.copied.stops();
        for (reason, count) in self.stacks.kernel.stops() {
            stops.insert(format!("frame_pointers_{}", reason.name()), *count);
        }
        let pending = self.stacks.kernel.pending();
        if pending > 0 {
            stops.insert("table_pending".to_owned(), pending);
        }
        stops
    }
}
