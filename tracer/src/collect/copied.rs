//! Blocks whose stacks the kernel copied (`--unwind dwarf`): their copy,
//! free and restore records are drained from the STACK_COPIES ring buffer,
//! each copy is unwound, and the per-stack totals of these blocks are kept
//! here, as exact as BY_STACK's: a block is counted at its copy and taken
//! off at its free, both sent by the kernel in the order they happened.
//!
//! Each distinct unwound stack is numbered here: `StackId::Copied`.
use std::collections::{BTreeMap, HashMap};

use anyhow::{Context as _, Result};
use aya::maps::{Map, MapData, RingBuf};
use tracer_ebpf::{StackCopy, StackFree, stack_record};

use super::contexts::EpochEntry;
use crate::{
    attach::cuda,
    model::{Counters, Frame, Kind, StackId, StackKey},
    symbolize::Symbols,
    unwind::{Unwinder, Unwound},
};

/// Recently freed blocks kept for a failed realloc's restore.
const RECENTLY_FREED: usize = 1 << 16;

#[derive(Clone, Copy)]
struct Block {
    key: StackKey,
    size: u64,
    /// The CUDA context epoch that owned it (0: none), as in LIVE.
    context_epoch: u32,
}

pub struct CopiedStacks {
    /// The STACK_COPIES map until a process needs copies: mapping the ring
    /// into tracer costs its size in resident memory.
    unused: Option<Map>,
    records: Option<RingBuf<MapData>>,
    unwinder: Unwinder,
    stacks: Vec<(u32, Unwound)>,
    stack_ids: HashMap<(u32, Unwound), StackId>,
    /// Stacks of mapping calls (mmap, brk), by (tgid, reference), until
    /// the mapping tracker takes them.
    mapping_stacks: HashMap<(u32, u32), StackId>,
    /// Live blocks by (tgid, reference).
    live: HashMap<(u32, u32), Block>,
    recently_freed: HashMap<(u32, u32), Block>,
    /// Per stack and CUDA context epoch, like the kernel's BY_STACK: the
    /// live counters of an ended epoch are what its destruction released.
    counters: HashMap<(StackKey, u32), Counters>,
    apis: HashMap<StackKey, &'static str>,
}

impl CopiedStacks {
    pub fn new(map: Map) -> Self {
        CopiedStacks {
            unused: Some(map),
            records: None,
            unwinder: Unwinder::new(),
            stacks: Vec::new(),
            stack_ids: HashMap::new(),
            mapping_stacks: HashMap::new(),
            live: HashMap::new(),
            recently_freed: HashMap::new(),
            counters: HashMap::new(),
            apis: HashMap::new(),
        }
    }

    /// Maps the ring buffer, once a process's stacks are copied.
    pub fn activate(&mut self) -> Result<()> {
        if let Some(map) = self.unused.take() {
            self.records =
                Some(RingBuf::try_from(map).context("STACK_COPIES is not a ring buffer")?);
        }
        Ok(())
    }

    /// The ring's file descriptor, readable when the kernel wakes tracer
    /// (a burst filled a quarter of it); None until it is mapped.
    pub fn ring_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::{AsFd as _, AsRawFd as _};
        self.records
            .as_ref()
            .map(|records| records.as_fd().as_raw_fd())
    }

    /// Applies every record the kernel sent since the last drain.
    pub fn drain(&mut self) {
        loop {
            let Some(item) = self.records.as_mut().and_then(RingBuf::next) else {
                break;
            };
            let record = item
                .get(..4)
                .map(|bytes| u32::from_ne_bytes(bytes.try_into().expect("4 bytes")));
            match record {
                Some(record @ (stack_record::COPY | stack_record::MAPPING_COPY))
                    if item.len() >= size_of::<StackCopy>() =>
                {
                    // SAFETY: the item starts with a whole StackCopy.
                    let copy: StackCopy = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
                    let stack = &item[size_of::<StackCopy>()..];
                    let length = (copy.length as usize).min(stack.len());
                    let mut unwound = self.unwinder.unwind(&copy, &stack[..length]);
                    drop(item);
                    if copy.python_stack != 0 {
                        // Its Python stack, as one more frame (collect::python).
                        let tag = tracer_ebpf::PYTHON_FRAME_TAG | u64::from(copy.python_stack);
                        unwound.addresses.push(tag);
                    }
                    if record == stack_record::COPY {
                        self.copied(&copy, unwound);
                    } else {
                        self.mapping_copied(&copy, unwound);
                    }
                }
                Some(kind @ (stack_record::FREE | stack_record::RESTORE))
                    if item.len() >= size_of::<StackFree>() =>
                {
                    // SAFETY: the item holds a whole StackFree.
                    let free: StackFree = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
                    drop(item);
                    if kind == stack_record::FREE {
                        self.freed(&free);
                    } else {
                        self.restored(&free);
                    }
                }
                _ => {}
            }
        }
    }

    /// The id of an unwound stack, new or seen before.
    fn stack_id(&mut self, pid: u32, unwound: Unwound) -> StackId {
        let stack = (pid, unwound);
        match self.stack_ids.get(&stack) {
            Some(&id) => id,
            None => {
                let id = StackId::Copied(self.stacks.len() as u32);
                self.stacks.push(stack.clone());
                self.stack_ids.insert(stack, id);
                id
            }
        }
    }

    fn mapping_copied(&mut self, copy: &StackCopy, unwound: Unwound) {
        let stack_id = self.stack_id(copy.tgid, unwound);
        if self.mapping_stacks.len() >= RECENTLY_FREED {
            // References of calls that failed, never taken.
            self.mapping_stacks.clear();
        }
        self.mapping_stacks
            .insert((copy.tgid, copy.stack_ref), stack_id);
    }

    /// The stack id of the mapping call whose event carries `stack_ref`
    /// (once: the tracker keeps it).
    pub fn take_mapping_stack(&mut self, tgid: u32, stack_ref: u32) -> Option<StackId> {
        self.mapping_stacks.remove(&(tgid, stack_ref))
    }

    /// Whether the copied stack `index` ends before its thread's start
    /// (deeper than the copy, or unwinding stopped).
    pub fn ends_early(&self, index: u32) -> bool {
        self.stacks
            .get(index as usize)
            .is_none_or(|(_, unwound)| unwound.end_marker().is_some())
    }

    /// Copies whose unwinding stopped early, by reason.
    pub fn stops(&self) -> BTreeMap<String, u64> {
        self.unwinder
            .stopped()
            .iter()
            .map(|(reason, count)| (reason.name().to_owned(), *count))
            .collect()
    }

    /// The return addresses of the copied stack `index`, innermost first.
    pub fn addresses(&self, index: u32) -> &[u64] {
        self.stacks
            .get(index as usize)
            .map_or(&[], |(_, unwound)| &unwound.addresses)
    }

    fn copied(&mut self, copy: &StackCopy, unwound: Unwound) {
        let Some(kind) = Kind::from_raw(copy.kind) else {
            return;
        };
        let stack_id = self.stack_id(copy.tgid, unwound);
        let key = StackKey {
            pid: copy.tgid,
            stack_id,
            kind,
        };
        if let Some(api) = cuda::api_name(copy.api) {
            self.apis.insert(key, api);
        }
        let counters = self.counters.entry((key, copy.context_epoch)).or_default();
        counters.alloc_bytes_total += copy.size;
        counters.alloc_count_total += 1;
        let block = Block {
            key,
            size: copy.size,
            context_epoch: copy.context_epoch,
        };
        if let Some(stale) = self.live.insert((copy.tgid, copy.stack_ref), block) {
            // A reference reused after 2^30 copies: the old block's free
            // was never seen.
            self.take_off(stale);
        }
        self.put_on(block);
    }

    fn freed(&mut self, free: &StackFree) {
        let Some(block) = self.live.remove(&(free.tgid, free.stack_ref)) else {
            return;
        };
        self.take_off(block);
        if self.recently_freed.len() >= RECENTLY_FREED {
            self.recently_freed.clear();
        }
        self.recently_freed
            .insert((free.tgid, free.stack_ref), block);
    }

    fn restored(&mut self, free: &StackFree) {
        if let Some(block) = self.recently_freed.remove(&(free.tgid, free.stack_ref)) {
            self.live.insert((free.tgid, free.stack_ref), block);
            self.put_on(block);
        }
    }

    fn put_on(&mut self, block: Block) {
        let counters = self
            .counters
            .entry((block.key, block.context_epoch))
            .or_default();
        counters.live_bytes += block.size as i64;
        counters.live_allocs += 1;
    }

    fn take_off(&mut self, block: Block) {
        let counters = self
            .counters
            .entry((block.key, block.context_epoch))
            .or_default();
        counters.live_bytes -= block.size as i64;
        counters.live_allocs -= 1;
    }

    /// The totals per stack and CUDA context epoch, as the kernel's
    /// BY_STACK keeps them, for `contexts::fold_epochs`: the live counters
    /// of an ended epoch are left out the same way.
    pub fn epoch_entries(&self) -> impl Iterator<Item = EpochEntry> + '_ {
        self.counters
            .iter()
            .map(|(&(key, context_epoch), &counters)| EpochEntry {
                key,
                context_epoch,
                counters,
            })
    }

    /// The CUDA function of each GPU stack.
    pub fn apis(&self) -> impl Iterator<Item = (StackKey, &'static str)> + '_ {
        self.apis.iter().map(|(key, api)| (*key, *api))
    }

    /// The frames of the copied stack `index`, innermost first, ending
    /// with a marker frame when the stack was deeper than the copy or
    /// unwinding stopped early ([`Unwound::end_marker`]).
    pub fn frames(&self, index: u32, symbols: &mut Symbols) -> Option<Vec<Frame>> {
        let (pid, unwound) = self.stacks.get(index as usize)?;
        let mut frames = symbols.stack_frames(*pid, &unwound.addresses);
        if let Some(marker) = unwound.end_marker() {
            frames.push(Frame {
                function: Some(marker),
                ..Frame::default()
            });
        }
        Some(frames)
    }
}
