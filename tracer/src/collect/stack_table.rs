//! The kernel's stack tables, bounded by what is live: a stack that holds
//! nothing is evicted when STACKS is over half full, and its id handed out
//! again; so are a runtime's stored stacks (`runtimes::StoredStacks`:
//! CPython's, PYTHON_STACKS) that no stack held names any more. The
//! tables then hold the stacks that hold memory plus a working set of at
//! most half the table, however many distinct stacks a run makes;
//! tracer's own memory per stack follows them (`kernel_stacks` forgets a
//! stack's frames once the model has folded it).
//!
//! The protocol, at each snapshot (probes run at every malloc: they only
//! pop an id from a queue where they took a new one from a counter):
//!
//! 1. BY_STACK is read (the snapshot's own read): a stack id holds nothing
//!    when the live bytes and blocks of all its entries are 0. Its totals
//!    are in the snapshot the model takes.
//! 2. Over half of `--max-stacks` linked, the ids holding nothing that
//!    allocated least recently are unlinked: their hash is removed from
//!    STACK_IDS, so no walk from then on finds them. A probe that found
//!    one just before still adds to BY_STACK (a live block) or MAPPING_PENDING.
//! 3. At a later snapshot, at least `GRACE` after the unlink (far longer
//!    than any probe runs), an unlinked id is evicted if it still holds
//!    nothing and no call in progress holds it (a realloc's old block
//!    waiting in PENDING or SIGNAL_SAVED for a failure, a mapping call in
//!    MAPPING_PENDING; read before the mapping events are drained, so a
//!    call ended since is in the events): its entries' totals fold into
//!    its name (`kernel_stacks`), its BY_STACK, STACK_API and STACKS
//!    entries are deleted, and the id goes back to the kernel through
//!    STACK_FREE_IDS, behind every id given back before it. An unlinked id
//!    that holds memory again stays, without its hash: a new walk of the
//!    same stack gets a new id, which joins the same name; it is evicted
//!    once it holds nothing.
//!
//! So a LIVE entry never points at an id that was handed out again for
//! other frames: every block of an evicted id was freed (its BY_STACK
//! entries showed it, after every probe that could still add a block had
//! run). The exceptions are counted drops: a block whose BY_STACK entry
//! could not be made (`by_stack_map_full`).
//!
//! Stored stack ids follow the same steps: one that neither a held stack
//! id, a name's frames, a copied stack nor a mapping stack carries is
//! unlinked from PYTHON_STACK_IDS, then after `GRACE` (still carried by
//! none: a stack stored since with it was read by then) deleted, and its
//! id given back through PYTHON_FREE_IDS.
use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use anyhow::Result;
use tracer_ebpf::{NO_STACK, StackFrames, StackTotals, is_copied_stack};

use super::Collector;
use crate::{
    attach::StackMaps,
    model::{Counters, Kind, Retired, StackId, StackKey},
    runtimes::{StoredStacks, stored_stack_tag},
};

/// How long an unlinked id waits at least before it is evicted: probes
/// that found it before the unlink have run by then.
const GRACE: Duration = Duration::from_secs(1);

/// How many rounds (snapshots) apart `-v` says what the tables hold.
const TABLE_LINE_EVERY: u64 = 10;

/// When an id was unlinked.
#[derive(Clone, Copy)]
struct Unlinked {
    round: u64,
    at: Instant,
}

impl Unlinked {
    fn waited(&self, round: u64) -> bool {
        self.round < round && self.at.elapsed() >= GRACE
    }
}

/// A stack id the kernel holds.
struct HeldId {
    /// Its key in STACK_IDS.
    hash: u64,
    /// The stored stack its frames end with (a runtime's:
    /// `runtimes::StoredStacks`).
    stored: Option<u32>,
    /// The processes that named it (`kernel_stacks`).
    pids: Vec<u32>,
    unlinked: Option<Unlinked>,
    /// Allocations counted (all of its entries) when last read, and the
    /// round they last changed in.
    allocs: u64,
    active_round: u64,
}

/// A stored stack id the kernel holds.
struct HeldStored {
    /// Its key in PYTHON_STACK_IDS.
    hash: u64,
    pid: u32,
    /// Held stack ids whose frames end with it.
    stack_ids: u32,
    unlinked: Option<Unlinked>,
}

/// What the tables hold, and how many were evicted.
#[derive(Default)]
pub struct StackTable {
    /// `--max-stacks`: STACKS and the stored stacks' table hold as many.
    capacity: usize,
    ids: HashMap<u32, HeldId>,
    stored: HashMap<u32, HeldStored>,
    round: u64,
    pub evicted: u64,
    pub stored_evicted: u64,
}

/// What one stack id holds now, from BY_STACK.
#[derive(Default)]
struct IdNow {
    live: bool,
    allocs: u64,
}

impl StackTable {
    pub fn new(capacity: u32) -> StackTable {
        StackTable {
            capacity: capacity as usize,
            ..StackTable::default()
        }
    }

    /// Whether an unlinked id waits for its eviction (the next round
    /// reads what calls in progress hold).
    pub fn evicts_next(&self) -> bool {
        self.ids.values().any(|id| id.unlinked.is_some())
    }

    /// The frames of stack id `id` (None when STACKS lacks it), learning
    /// the id.
    pub(super) fn read(&mut self, maps: &mut StackMaps<'_>, id: u32) -> Option<Vec<u64>> {
        let frames = maps.stack(id)?;
        self.learn(maps, id, &frames);
        let count = (frames.count as usize).min(frames.frames.len());
        Some(frames.frames[..count].to_vec())
    }

    /// Learns stack id `id` from its STACKS entry (and the stored stack
    /// it names).
    fn learn(&mut self, maps: &mut StackMaps<'_>, id: u32, frames: &StackFrames) {
        if self.ids.contains_key(&id) {
            return;
        }
        let count = (frames.count as usize).min(frames.frames.len());
        // Counted in the stored stack's `stack_ids` when it is known.
        let stored = stored_stack_tag(&frames.frames[..count]).filter(|&stored| {
            self.learn_stored(maps, stored);
            self.stored
                .get_mut(&stored)
                .map(|held| held.stack_ids += 1)
                .is_some()
        });
        self.ids.insert(
            id,
            HeldId {
                hash: frames.hash(),
                stored,
                pids: Vec::new(),
                unlinked: None,
                allocs: 0,
                active_round: self.round,
            },
        );
    }

    /// Names, through `stored`, the stacks the kernel stored since the
    /// last call, learning their ids.
    pub(super) fn resolve_new_stored(
        &mut self,
        maps: &mut StackMaps<'_>,
        stored: &mut dyn StoredStacks,
    ) {
        for id in maps.new_stored_ids() {
            if let Some(stack) = maps.stored_stack(id) {
                stored.resolve(stack.tgid, id, &stack);
                self.learn_stored(maps, id);
            }
        }
    }

    /// Names stored stack `id` of `pid` through `stored`, if the kernel
    /// still has it (a stack whose id did not fit in the queue of new
    /// ids), learning the id.
    pub(super) fn resolve_stored(
        &mut self,
        maps: &mut StackMaps<'_>,
        stored: &mut dyn StoredStacks,
        pid: u32,
        id: u32,
    ) {
        if let Some(stack) = maps.stored_stack(id)
            && stack.tgid == pid
        {
            stored.resolve(pid, id, &stack);
            self.learn_stored(maps, id);
        }
    }

    /// Learns stored stack id `id` (unknown when the kernel's table lacks
    /// it).
    pub(super) fn learn_stored(&mut self, maps: &mut StackMaps<'_>, id: u32) {
        if self.stored.contains_key(&id) {
            return;
        }
        if let Some(stack) = maps.stored_stack(id) {
            self.stored.insert(
                id,
                HeldStored {
                    hash: stack.hash(stack.tgid),
                    pid: stack.tgid,
                    stack_ids: 0,
                    unlinked: None,
                },
            );
        }
    }
}

/// What each held id holds now.
fn by_id(entries: &[(tracer_ebpf::ByStackKey, StackTotals)]) -> HashMap<u32, IdNow> {
    let mut ids: HashMap<u32, IdNow> = HashMap::new();
    for &(key, totals) in entries {
        if key.stack_id == NO_STACK || is_copied_stack(key.stack_id) {
            continue;
        }
        let now = ids.entry(key.stack_id).or_default();
        now.live |= totals.live_bytes != 0 || totals.live_allocs != 0;
        now.allocs = now.allocs.wrapping_add(totals.alloc_count);
    }
    ids
}

impl Collector {
    /// The name kernel stack `id` of `pid` stands for (`Lost` when the
    /// kernel no longer has its frames), learning the id.
    pub(super) fn kernel_name(&mut self, pid: u32, id: u32) -> StackId {
        if let Some(name) = self.stacks.kernel.name_of(pid, id) {
            return StackId::Kernel(name);
        }
        let Some(frames) = self.stacks.table.read(&mut self.probes.stack_maps(), id) else {
            return StackId::Lost;
        };
        let Some(name) = self.stacks.kernel.name(pid, id, || frames) else {
            return StackId::Lost;
        };
        if let Some(held) = self.stacks.table.ids.get_mut(&id) {
            held.pids.push(pid);
        }
        StackId::Kernel(name)
    }

    /// Names the stacks the kernel stored since the last call (their
    /// code objects may be gone later), learning their ids.
    pub(super) fn resolve_stored_stacks(&mut self) {
        let stored = self.runtimes.stored_stacks();
        if !stored.is_empty() {
            self.stacks
                .table
                .resolve_new_stored(&mut self.probes.stack_maps(), stored);
        }
    }

    /// One round of eviction (see the module's comment), after the
    /// snapshot's BY_STACK read (`by_stack`); `held_by_calls` was read
    /// before the mapping events were drained. Returns the names that hold
    /// nothing and have no stack id left, for the model to fold.
    pub(super) fn evict_stacks(
        &mut self,
        by_stack: &[(tracer_ebpf::ByStackKey, StackTotals)],
        held_by_calls: &HashSet<u32>,
    ) -> Result<Vec<Retired>> {
        self.stacks.table.round += 1;
        let round = self.stacks.table.round;
        let now = by_id(by_stack);
        for &id in held_by_calls {
            if !self.stacks.table.ids.contains_key(&id) {
                self.stacks.table.read(&mut self.probes.stack_maps(), id);
            }
        }
        for (id, held) in &mut self.stacks.table.ids {
            if let Some(now) = now.get(id)
                && now.allocs != held.allocs
            {
                held.allocs = now.allocs;
                held.active_round = round;
            }
        }
        let holds =
            |id: &u32| now.get(id).is_some_and(|now| now.live) || held_by_calls.contains(id);
        let mut evicted: HashMap<u32, Vec<(tracer_ebpf::ByStackKey, StackTotals)>> = self
            .stacks
            .table
            .ids
            .iter()
            .filter(|(id, held)| held.unlinked.is_some_and(|u| u.waited(round)) && !holds(id))
            .map(|(&id, _)| (id, Vec::new()))
            .collect();
        if !evicted.is_empty() {
            for &(key, totals) in by_stack {
                if let Some(entries) = evicted.get_mut(&key.stack_id) {
                    entries.push((key, totals));
                }
            }
        }
        for (id, entries) in evicted {
            self.evict_stack(id, &entries)?;
        }
        self.unlink_stacks(round, &holds)?;
        self.evict_stored_stacks(round)?;
        Ok(self.retired())
    }

    /// Evicts stack id `id`, whose BY_STACK entries are `entries`.
    fn evict_stack(
        &mut self,
        id: u32,
        entries: &[(tracer_ebpf::ByStackKey, StackTotals)],
    ) -> Result<()> {
        for &(key, totals) in entries {
            if let (Some(name), Some(kind)) = (
                self.stacks.kernel.name_of(key.tgid, id),
                Kind::from_raw(key.kind),
            ) {
                let counters = Counters {
                    live_bytes: totals.live_bytes as i64,
                    live_allocs: totals.live_allocs as i64,
                    alloc_bytes_total: totals.alloc_bytes,
                    alloc_count_total: totals.alloc_count,
                };
                self.stacks.kernel.fold(name, kind, counters);
            }
        }
        let keys: Vec<tracer_ebpf::ByStackKey> = entries.iter().map(|(key, _)| *key).collect();
        self.probes.stack_maps().evict_stack(id, &keys)?;
        let held = self
            .stacks
            .table
            .ids
            .remove(&id)
            .expect("evicting a held id");
        for pid in held.pids {
            self.stacks.kernel.evicted(pid, id);
        }
        if let Some(stored) = held.stored
            && let Some(held_stored) = self.stacks.table.stored.get_mut(&stored)
        {
            held_stored.stack_ids -= 1;
        }
        self.stacks.table.evicted += 1;
        Ok(())
    }

    /// Over half the table linked: unlinks the ids holding nothing that
    /// allocated least recently, down to half.
    fn unlink_stacks(&mut self, round: u64, holds: &dyn Fn(&u32) -> bool) -> Result<()> {
        let table = &mut self.stacks.table;
        let linked = table
            .ids
            .values()
            .filter(|held| held.unlinked.is_none())
            .count();
        let most = table.capacity / 2;
        if linked <= most {
            return Ok(());
        }
        let mut idle: Vec<(u64, u32)> = table
            .ids
            .iter()
            .filter(|(id, held)| held.unlinked.is_none() && !holds(id))
            .map(|(&id, held)| (held.active_round, id))
            .collect();
        idle.sort_unstable();
        idle.truncate(linked - most);
        let mut maps = self.probes.stack_maps();
        let at = Instant::now();
        for (_, id) in idle {
            let held = table.ids.get_mut(&id).expect("listed");
            maps.unlink(false, held.hash, id)?;
            held.unlinked = Some(Unlinked { round, at });
        }
        Ok(())
    }

    /// Unlinks the stored stacks nothing carries, and evicts those
    /// unlinked long enough that still none does.
    fn evict_stored_stacks(&mut self, round: u64) -> Result<()> {
        let pinned: HashSet<u32> = self
            .stacks
            .copied
            .stored_stacks()
            .chain(self.mappings.stored_stacks())
            .collect();
        let carried = |id: &u32, held: &HeldStored| {
            held.stack_ids > 0 || self.stacks.kernel.names_stored_stack(*id) || pinned.contains(id)
        };
        let mut evict = Vec::new();
        let mut unlink = Vec::new();
        for (&id, held) in &self.stacks.table.stored {
            if carried(&id, held) {
                continue;
            }
            match held.unlinked {
                Some(unlinked) if unlinked.waited(round) => evict.push(id),
                Some(_) => {}
                None => unlink.push(id),
            }
        }
        let mut maps = self.probes.stack_maps();
        let at = Instant::now();
        for id in unlink {
            let held = self.stacks.table.stored.get_mut(&id).expect("listed");
            maps.unlink(true, held.hash, id)?;
            held.unlinked = Some(Unlinked { round, at });
        }
        for id in evict {
            maps.evict_stored_stack(id)?;
            let held = self.stacks.table.stored.remove(&id).expect("listed");
            self.runtimes.stored_stacks().forget(held.pid, id);
            self.stacks.table.stored_evicted += 1;
        }
        Ok(())
    }

    /// The names left without a stack id, as the model's keys, with
    /// whether each reaches its thread's start (for the stack quality of
    /// what the model folds). A name that never counted anything is
    /// forgotten at once.
    fn retired(&mut self) -> Vec<Retired> {
        let mut retired = Vec::new();
        for (pid, name, kinds) in self.stacks.kernel.take_dead() {
            if kinds.is_empty() {
                self.stacks.kernel.forget(name);
                continue;
            }
            for kind in kinds {
                let key = StackKey {
                    pid,
                    stack_id: StackId::Kernel(name),
                    kind,
                };
                let reaches_entry = self.reaches_entry(&key);
                retired.push(Retired { key, reaches_entry });
            }
        }
        retired
    }

    /// Every `TABLE_LINE_EVERY` rounds, a line for `-v`: what the stack
    /// tables and the names hold, and what was evicted.
    pub(super) fn stack_table_line(&self) -> Option<String> {
        let table = &self.stacks.table;
        if !table.round.is_multiple_of(TABLE_LINE_EVERY) {
            return None;
        }
        let unlinked = table
            .ids
            .values()
            .filter(|id| id.unlinked.is_some())
            .count();
        let (names, pairs) = self.stacks.kernel.counts();
        Some(format!(
            "stack table: {} of {} ids held ({unlinked} unlinked), {} Python stacks; \
             {names} stacks named ({pairs} ids named); evicted {} stacks, {} Python stacks",
            table.ids.len(),
            table.capacity,
            table.stored.len(),
            table.evicted,
            table.stored_evicted,
        ))
    }

    /// Forgets the stacks the model folded (`Model::take_folded`): their
    /// frames, symbolized frames and CUDA API. They never come back: the
    /// same frames walked again get a new name.
    pub fn forget_stacks(&mut self, keys: &[StackKey]) {
        for key in keys {
            if let StackId::Kernel(name) = key.stack_id {
                self.stacks.kernel.forget(name);
            }
            self.stacks.frames.forget_stack(key);
            self.stacks.apis.remove(key);
        }
    }
}
