//! The counters of every stack the collector reads at each snapshot: the
//! kernel's per-stack totals by CUDA context epoch, the copied stacks'
//! and the mapping kinds'.
use std::collections::HashSet;

use anyhow::Result;
use tracer_ebpf::stat;

use super::{Collector, contexts, live_pids};
use crate::{
    attach::sources::cuda,
    model::{Counters, Kind, Snapshot, StackId, StackKey},
    procfs,
};

use contexts::EpochEntry;

/// Page faults walked a second at most with `--resident` (about 4 µs each
/// on a torch process: under 1 % of a core).
const FAULT_WALKS_PER_S: f64 = 2000.0;
/// Faults between two snapshots that are walked, all of them, however
/// fast they came (a burst of 2 000: about 8 ms of walks): the shift rises
/// only past them.
const FAULTS_ALWAYS_WALKED: u64 = 2000;

impl Collector {
    /// Every per-stack entry by CUDA context epoch: the kernel's (each
    /// stack id as its name, with the totals folded into the names from
    /// the ids evicted), and those kept here for blocks with copied
    /// stacks, after draining every copy sent so far.
    pub(super) fn epoch_entries(&mut self) -> Result<Vec<EpochEntry>> {
        self.stacks.kernel.new_pass();
        let by_stack = self.probes.maps().by_stack()?;
        let mut entries: Vec<EpochEntry> = Vec::with_capacity(by_stack.len());
        for (key, totals) in &by_stack {
            let Some(mut entry) = EpochEntry::from_kernel(key, totals) else {
                continue;
            };
            if let StackId::Kernel(id) = entry.key.stack_id {
                entry.key.stack_id = self.kernel_name(key.tgid, id);
            }
            entries.push(entry);
        }
        entries.extend(
            self.stacks
                .kernel
                .folded()
                .map(|(pid, name, kind, counters)| EpochEntry {
                    key: StackKey {
                        pid,
                        stack_id: StackId::Kernel(name),
                        kind,
                    },
                    context_epoch: 0,
                    counters,
                }),
        );
        self.stacks.by_stack = by_stack;
        self.start_copy_reader()?;
        self.stacks.copied.flush();
        entries.extend(self.stacks.copied.epoch_entries());
        Ok(entries)
    }

    /// Starts the copy reader once any process's stacks are copied. Every
    /// read of the copies calls this first: a process whose stacks began
    /// to be copied since the last copies tick (`--unwind auto` decides at
    /// `add_target`) has records in the ring already, and a final snapshot
    /// taken before that tick must read them too.
    pub(super) fn start_copy_reader(&mut self) -> Result<()> {
        if self.probes.copies_any_stacks() {
            self.stacks.copied.activate()?;
        }
        Ok(())
    }

    /// Applies the mapping calls made so far. Their copied stacks come
    /// through the copy reader (a spawned program's first mappings come
    /// right after it is attached).
    pub(super) fn drain_mappings(&mut self) -> Result<()> {
        self.start_copy_reader()?;
        let (probes, table) = (&mut self.probes, &mut self.stacks.table);
        self.mappings.drain(&mut self.stacks.copied, &mut |id| {
            table.read(&mut probes.stack_maps(), id).unwrap_or_default()
        });
        Ok(())
    }

    /// The counters of every stack: the epochs of a stack summed (ended
    /// ones released), and the mapping kinds' stacks.
    pub(super) fn stack_counters(&mut self) -> Result<Vec<(StackKey, Counters)>> {
        let entries = self.epoch_entries()?;
        let epochs = self.probes.maps().epochs()?;
        let stacks = contexts::fold_epochs(entries, &epochs);
        self.drain_mappings()?;
        let mut stacks: Vec<(StackKey, Counters)> = stacks.into_iter().collect();
        stacks.extend(self.mappings.counters());
        if self.watching.comms.is_some() {
            // Processes that exited are forgotten (copied stacks and
            // mappings keep their last counters here).
            let alive = live_pids(&self.watching.processes);
            stacks.retain(|(key, _)| alive.contains(&key.pid));
        }
        Ok(stacks)
    }

    /// `--resident`: follows fewer pages where faults come fast, more
    /// where they slow down, so that the kernel walks about
    /// `FAULT_WALKS_PER_S` stacks a second at most: a rate over twice that
    /// (and more than `FAULTS_ALWAYS_WALKED` faults since the last
    /// snapshot) raises the sampling shift at once by what brings it back
    /// under
    /// (a burst of a million faults a second: 9 halvings, capped at
    /// `MAX_SAMPLE_SHIFT`), one under half of it lowers the shift by one.
    fn pace_fault_sampling(&mut self) -> Result<()> {
        let Some(resident) = self.probes.resident_pages() else {
            return Ok(());
        };
        let (faults, rate) = self.mappings.take_fault_rate();
        let shift = resident.sample_shift;
        let next = if rate > 2.0 * FAULT_WALKS_PER_S && faults > FAULTS_ALWAYS_WALKED {
            shift + (rate / FAULT_WALKS_PER_S).log2().ceil() as u32
        } else if rate < 0.5 * FAULT_WALKS_PER_S {
            shift.saturating_sub(1)
        } else {
            shift
        }
        .min(tracer_ebpf::target::MAX_SAMPLE_SHIFT);
        if next != shift {
            self.probes.set_fault_sample_shift(next)?;
            self.fault_sample_shift_max = self.fault_sample_shift_max.max(next);
        }
        Ok(())
    }

    /// Reads the stacks' counters, STATS, and the RSS and CPU time of the
    /// live targets, then evicts what the stack tables need not hold
    /// (`stack_table`).
    pub(super) fn snapshot(&mut self) -> Result<Snapshot> {
        let elapsed_s = self.elapsed_s();
        // Before the mapping events are drained: a call that ends after
        // this read is in them.
        let held_by_calls = if self.stacks.table.evicts_next() {
            self.probes.stack_maps().held_by_calls()?
        } else {
            HashSet::new()
        };
        let stacks = self.stack_counters()?;
        self.pace_fault_sampling()?;
        self.read_apis();
        let mut stats = self.probes.maps().stats()?;
        let by_stack = std::mem::take(&mut self.stacks.by_stack);
        let retired = self.evict_stacks(&by_stack, &held_by_calls)?;
        let (returns_restored, restores_lost) = self
            .probes
            .exceptions()
            .map_or((0, 0), |exceptions| exceptions.counts());
        for (index, count) in [
            (stat::STACKS_EVICTED, self.stacks.table.evicted),
            (
                stat::PYTHON_STACKS_EVICTED,
                self.stacks.table.stored_evicted,
            ),
            (stat::EXCEPTION_RETURNS_RESTORED, returns_restored),
            (stat::DROP_EXCEPTION_RESTORE_LOST, restores_lost),
            (stat::HUGE_PAGE_FAULTS, self.mappings.huge_page_faults()),
            (
                stat::FAULT_SAMPLE_SHIFT,
                u64::from(self.fault_sample_shift_max),
            ),
        ] {
            if let Some(counter) = stats.get_mut(index as usize) {
                *counter += count;
            }
        }
        self.observe_cost(stats.clone());
        Ok(Snapshot {
            elapsed_s,
            stacks,
            stats,
            rss_bytes: live_pids(&self.watching.processes)
                .into_iter()
                .filter_map(|pid| Some((pid, procfs::rss_bytes(pid)?)))
                .collect(),
            retired,
            cpu_s: self
                .watching
                .processes
                .iter()
                .filter(|watched| watched.is_alive())
                .filter_map(|watched| Some((watched.target.pid, watched.cpu_since_start_s()?)))
                .collect(),
        })
    }

    /// The CUDA function of each GPU stack: the kernel's STACK_API and the
    /// copied stacks'.
    pub(super) fn read_apis(&mut self) {
        let maps = self.probes.maps();
        for (key, api) in maps.stack_apis() {
            let (Some(kind), Some(api)) = (Kind::from_raw(key.kind), cuda::api_name(api)) else {
                continue;
            };
            let stack_id = match key.stack_id {
                tracer_ebpf::NO_STACK => StackId::Lost,
                id => self.kernel_name(key.tgid, id),
            };
            let key = StackKey {
                pid: key.tgid,
                stack_id,
                kind,
            };
            self.stacks.apis.insert(key, api);
        }
        self.stacks.apis.extend(self.stacks.copied.apis());
    }
}
