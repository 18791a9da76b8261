//! The one reader of the kernel's maps that collect snapshots: per-stack
//! totals, counters, frame-pointer stacks, CUDA context epochs and the API
//! of each GPU stack. Map values come back as the ABI types of
//! `tracer_ebpf`; turning them into the model's is collect's work.
use std::collections::HashMap;

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    maps::{HashMap as KernelHashMap, IterableMap as _, MapData, PerCpuArray},
};
use tracer_ebpf::{LiveAlloc, LiveKey, StackFrames, StackKey, StackTotals, stat};

use super::Probes;

/// Reads the maps of a loaded object.
pub struct KernelMaps<'a> {
    ebpf: &'a Ebpf,
}

impl Probes {
    /// The kernel's maps, to read.
    pub fn maps(&self) -> KernelMaps<'_> {
        KernelMaps { ebpf: &self.ebpf }
    }
}

impl KernelMaps<'_> {
    /// Every BY_STACK entry: the totals of one stack, kind and CUDA context
    /// epoch in one process.
    pub fn by_stack(&self) -> Result<Vec<(StackKey, StackTotals)>> {
        let by_stack: KernelHashMap<&MapData, StackKey, StackTotals> = KernelHashMap::try_from(
            self.ebpf
                .map(tracer_ebpf::map::BY_STACK)
                .context("eBPF object lacks BY_STACK")?,
        )?;
        by_stack
            .iter()
            .map(|entry| entry.context("could not read BY_STACK"))
            .collect()
    }

    /// Every LIVE entry of process `tgid`: its outstanding blocks by
    /// address (`holders` scans for pointers to them), and how many
    /// entries went away while the table was walked (freed meanwhile).
    pub fn live_blocks(&self, tgid: u32) -> Result<(HashMap<u64, LiveAlloc>, u64)> {
        let live: KernelHashMap<&MapData, LiveKey, LiveAlloc> = KernelHashMap::try_from(
            self.ebpf
                .map(tracer_ebpf::map::LIVE)
                .context("eBPF object lacks LIVE")?,
        )?;
        // A key deleted under the walk sends the kernel's next-key back to
        // the first bucket: entries are met again (kept once), and the walk
        // is cut off after a bounded number of steps.
        let most_steps =
            4 * u64::from(live.map().info().map_or(1 << 20, |info| info.max_entries()));
        let (mut blocks, mut gone, mut steps) = (HashMap::new(), 0, 0u64);
        for entry in live.iter() {
            steps += 1;
            if steps > most_steps {
                break;
            }
            match entry {
                Ok((key, block)) if key.tgid == tgid => {
                    blocks.insert(key.address, block);
                }
                Ok(_) => {}
                Err(_) => gone += 1,
            }
        }
        Ok((blocks, gone))
    }

    /// STATS by `tracer_ebpf::stat` index, summed over CPUs.
    pub fn stats(&self) -> Result<Vec<u64>> {
        let counters: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(
            self.ebpf
                .map(tracer_ebpf::map::STATS)
                .context("eBPF object lacks STATS")?,
        )?;
        (0..stat::COUNT)
            .map(|index| {
                let per_cpu = counters.get(&index, 0).context("could not read STATS")?;
                Ok(per_cpu.iter().sum())
            })
            .collect()
    }

    /// The return addresses of a STACKS entry, innermost first (empty when
    /// the id is not there).
    pub fn stack(&self, stack_id: u32) -> Vec<u64> {
        let Some(Ok(stacks)) = self
            .ebpf
            .map(tracer_ebpf::map::STACKS)
            .map(KernelHashMap::<&MapData, u32, StackFrames>::try_from)
        else {
            return Vec::new();
        };
        stacks
            .get(&stack_id, 0)
            .map(|stack| {
                let count = (stack.count as usize).min(stack.frames.len());
                stack.frames[..count].to_vec()
            })
            .unwrap_or_default()
    }

    /// The current CUDA context epoch of each process that ended one (the
    /// others are at `tracer_ebpf::FIRST_CONTEXT_EPOCH`).
    pub fn epochs(&self) -> Result<HashMap<u32, u32>> {
        let epochs: KernelHashMap<&MapData, u32, u64> = KernelHashMap::try_from(
            self.ebpf
                .map(tracer_ebpf::map::CONTEXT_EPOCH)
                .context("eBPF object lacks CONTEXT_EPOCH")?,
        )?;
        epochs
            .iter()
            .map(|entry| {
                let (tgid, epoch) = entry.context("could not read CONTEXT_EPOCH")?;
                Ok((tgid, epoch as u32))
            })
            .collect()
    }

    /// The `gpu_api` id of the CUDA function that made each GPU stack's
    /// memory (STACK_API).
    pub fn stack_apis(&self) -> Vec<(StackKey, u32)> {
        let Some(Ok(apis)) = self
            .ebpf
            .map(tracer_ebpf::map::STACK_API)
            .map(KernelHashMap::<&MapData, StackKey, u32>::try_from)
        else {
            return Vec::new();
        };
        apis.iter().filter_map(Result::ok).collect()
    }
}
