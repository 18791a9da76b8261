//! Blocks whose stacks the kernel copied (`--unwind copy`): their copy,
//! free and restore records are read from the STACK_COPIES ring buffer and
//! each copy is unwound on a thread of its own (`copy_reader`), and the
//! per-stack totals of these blocks are kept
//! here, as exact as BY_STACK's: a block is counted at its copy and taken
//! off at its free, both sent by the kernel in the order they happened.
//! A free that found the ring full waits in the kernel's COPY_FREES map
//! instead, read after the ring at every drain: no free is lost to a full
//! ring, so a burst never leaves phantom live blocks behind. An exec comes
//! in the ring too, after the old image's last record: its blocks go then.
//!
//! Each distinct unwound stack is numbered here: `StackId::Copied`.
use std::collections::{BTreeMap, HashMap, HashSet};

use anyhow::Result;
use aya::maps::Map;
use tracer_ebpf::{CopyRef, StackCopy, StackFree, stack_record};

use super::{
    contexts::EpochEntry,
    copy_reader::{CopyReader, Message},
};
use crate::{
    attach::sources::cuda,
    model::{Counters, Frame, Kind, StackId, StackKey},
    symbolize::Symbols,
    unwind::Unwound,
};

/// Recently freed blocks kept for a failed realloc's restore.
const RECENTLY_FREED: usize = 1 << 16;

/// Inserts into a set of references waiting for their other half, which
/// only a lost record leaves unmatched: emptied when it grows too large.
fn bounded_insert(set: &mut HashSet<(u32, u32)>, reference: (u32, u32)) {
    if set.len() >= RECENTLY_FREED {
        set.clear();
    }
    set.insert(reference);
}

#[derive(Clone, Copy)]
struct Block {
    key: StackKey,
    size: u64,
    /// The CUDA context epoch that owned it (0: none), as in LIVE.
    context_epoch: u32,
}

/// Wide: the copy path's bookkeeping (copies unwound, their ids, the blocks
/// they hold, frees and restores that came early, stops, counters): maps keyed
/// differently, all updated together per copy.
pub struct CopiedStacks {
    /// The STACK_COPIES and COPY_FREES maps until a process needs copies:
    /// mapping the ring into tracer costs its size in resident memory.
    unused: Option<(Map, [Map; 2])>,
    /// The thread that reads and unwinds the copies.
    reader: Option<CopyReader>,
    stacks: Vec<(u32, Unwound)>,
    stack_ids: HashMap<(u32, Unwound), StackId>,
    /// Stacks of mapping calls (mmap, brk), by (tgid, reference), until
    /// the mapping tracker takes them.
    mapping_stacks: HashMap<(u32, u32), StackId>,
    /// Live blocks by (tgid, reference).
    live: HashMap<(u32, u32), Block>,
    recently_freed: HashMap<(u32, u32), Block>,
    /// Frees from COPY_FREES of blocks whose copy was not read yet (it
    /// waits in the ring behind a record still being written).
    early_frees: HashSet<(u32, u32)>,
    /// Restores read from the ring for blocks whose free waits in
    /// COPY_FREES: that free is cancelled when it is read.
    early_restores: HashSet<(u32, u32)>,
    /// Copies whose unwinding stopped early, by reason.
    stopped: BTreeMap<String, u64>,
    /// Per stack and CUDA context epoch, like the kernel's BY_STACK: the
    /// live counters of an ended epoch are what its destruction released.
    counters: HashMap<(StackKey, u32), Counters>,
    apis: HashMap<StackKey, &'static str>,
}

impl CopiedStacks {
    /// Forgets a process that exited (`--comm`): its unwinder and blocks.
    pub fn forget(&mut self, pid: u32) {
        if let Some(reader) = &self.reader {
            reader.forget(pid);
        }
        self.stack_ids.retain(|(stack_pid, _), _| *stack_pid != pid);
        self.mapping_stacks
            .retain(|(stack_pid, _), _| *stack_pid != pid);
        self.live.retain(|(block_pid, _), _| *block_pid != pid);
        self.recently_freed
            .retain(|(block_pid, _), _| *block_pid != pid);
        self.counters.retain(|(key, _), _| key.pid != pid);
        self.apis.retain(|key, _| key.pid != pid);
    }

    /// `copy_frees`: COPY_FREES and COPY_FREES_MADE.
    pub fn new(ring: Map, copy_frees: [Map; 2]) -> Self {
        CopiedStacks {
            unused: Some((ring, copy_frees)),
            reader: None,
            stacks: Vec::new(),
            stack_ids: HashMap::new(),
            mapping_stacks: HashMap::new(),
            live: HashMap::new(),
            recently_freed: HashMap::new(),
            early_frees: HashSet::new(),
            early_restores: HashSet::new(),
            stopped: BTreeMap::new(),
            counters: HashMap::new(),
            apis: HashMap::new(),
        }
    }

    /// Maps the ring buffer and starts reading it, once a process's
    /// stacks are copied.
    pub fn activate(&mut self) -> Result<()> {
        if let Some((ring, copy_frees)) = self.unused.take() {
            self.reader = Some(CopyReader::start(ring, copy_frees)?);
        }
        Ok(())
    }

    /// Applies what the reader read so far, without waiting.
    pub fn drain(&mut self) {
        while let Some(message) = self.reader.as_ref().and_then(CopyReader::try_next) {
            self.apply(message);
        }
    }

    /// Applies every record the kernel sent until now (waits for the
    /// reader to read them).
    pub fn flush(&mut self) {
        let Some(mut reader) = self.reader.take() else {
            return;
        };
        reader.flush(|message| self.apply(message));
        self.reader = Some(reader);
    }

    fn apply(&mut self, message: Message) {
        match message {
            Message::Copy(copy, unwound) => {
                if let Some(reason) = unwound.stopped {
                    *self.stopped.entry(reason.name().to_owned()).or_default() += 1;
                }
                if copy.record == stack_record::COPY {
                    self.copied(&copy, unwound);
                } else {
                    self.mapping_copied(&copy, unwound);
                }
            }
            Message::Free(free) if free.record == stack_record::FREE => self.freed(&free),
            Message::Free(exec) if exec.record == stack_record::EXEC => self.replaced(exec.tgid),
            Message::Free(restore) => self.restored(&restore),
            Message::Deferred(key, change) => self.deferred(key, change),
            Message::Flushed(_) => {}
        }
    }

    /// Applies the frees minus restores of a block that found the ring
    /// full, read after every ring record before them: its copy came
    /// first, unless it waits behind a record still being written.
    fn deferred(&mut self, key: CopyRef, change: i64) {
        let free = StackFree {
            record: stack_record::FREE,
            tgid: key.tgid,
            stack_ref: key.stack_ref,
            pad: 0,
        };
        let reference = (key.tgid, key.stack_ref);
        if change > 0 {
            if self.early_restores.remove(&reference) {
                return;
            }
            if !self.live.contains_key(&reference) {
                bounded_insert(&mut self.early_frees, reference);
                return;
            }
            self.freed(&free);
        } else if change < 0 {
            self.restored(&free);
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

    /// The Python stack ids the copied stacks carry: the kernel keeps them
    /// (`stack_table`).
    pub fn stored_stacks(&self) -> impl Iterator<Item = u32> + '_ {
        self.stacks
            .iter()
            .filter_map(|(_, unwound)| crate::runtimes::stored_stack_tag(&unwound.addresses))
    }

    /// Whether the copied stack `index` ends before its thread's start
    /// (deeper than the copy, or unwinding stopped).
    pub fn ends_early(&self, index: u32) -> bool {
        self.stacks
            .get(index as usize)
            .is_none_or(|(_, unwound)| unwound.end_marker().is_some())
    }

    /// Unwinds what is in the ring, then rereads the objects `pid` maps:
    /// its image changed (exec) or its loader mapped more.
    pub fn remap(&mut self, pid: u32) {
        if let Some(reader) = &self.reader {
            reader.refresh(pid);
        }
        // Waits for the reader's round that applied the refresh.
        self.flush();
    }

    /// Copies whose unwinding stopped early, by reason.
    pub fn stops(&self) -> BTreeMap<String, u64> {
        self.stopped.clone()
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
        if self.early_frees.remove(&(copy.tgid, copy.stack_ref)) {
            // Freed already (its free found the ring full and was read
            // first): counted in the running totals only.
            if self.recently_freed.len() >= RECENTLY_FREED {
                self.recently_freed.clear();
            }
            self.recently_freed
                .insert((copy.tgid, copy.stack_ref), block);
            return;
        }
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

    /// `pid` replaced its image (exec): every block of the old one is gone
    /// (no free of them comes after this record). Those no CUDA context
    /// owns come off; the context-owned ones are released by the end of
    /// their epoch, which the exec also ends.
    fn replaced(&mut self, pid: u32) {
        let gone: Vec<Block> = self
            .live
            .extract_if(|&(block_pid, _), _| block_pid == pid)
            .map(|(_, block)| block)
            .collect();
        for block in gone {
            if block.context_epoch == 0 {
                self.take_off(block);
            }
        }
        self.recently_freed
            .retain(|&(block_pid, _), _| block_pid != pid);
    }

    fn restored(&mut self, free: &StackFree) {
        let reference = (free.tgid, free.stack_ref);
        if let Some(block) = self.recently_freed.remove(&reference) {
            self.live.insert(reference, block);
            self.put_on(block);
        } else if self.live.contains_key(&reference) {
            // Its free found the ring full and waits in COPY_FREES.
            bounded_insert(&mut self.early_restores, reference);
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

    /// The stack a live block with copied stack `stack_ref` (its LIVE
    /// entry's stack id) is counted under.
    pub fn block_key(&self, tgid: u32, stack_ref: u32) -> Option<StackKey> {
        self.live.get(&(tgid, stack_ref)).map(|block| block.key)
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
