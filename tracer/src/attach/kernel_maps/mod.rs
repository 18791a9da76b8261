//! The one reader of the kernel's maps that collect snapshots: per-stack
//! totals, counters, frame-pointer stacks, CUDA context epochs and the API
//! of each GPU stack. Map values come back as the ABI types of
//! `tracer_ebpf`; turning them into the model's is collect's work.
pub mod stacks;
use std::collections::HashMap;

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    maps::{HashMap as KernelHashMap, IterableMap as _, MapData, PerCpuArray},
};
use tracer_ebpf::{ByStackKey, LiveAlloc, LiveKey, StackFrames, StackTotals, stat};

use crate::attach::Probes;

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
    /// epoch in one process. Read a batch of buckets per system call
    /// (BPF_MAP_LOOKUP_BATCH: 10^5 stacks took 0.2 s of syscall pairs at
    /// every snapshot), or entry by entry on a kernel without it.
    pub fn by_stack(&self) -> Result<Vec<(ByStackKey, StackTotals)>> {
        let by_stack: KernelHashMap<&MapData, ByStackKey, StackTotals> = KernelHashMap::try_from(
            self.ebpf
                .map(tracer_ebpf::map::BY_STACK)
                .context("eBPF object lacks BY_STACK")?,
        )?;
        let mut entries = Vec::new();
        let batched = lookup_batches(by_stack.map(), &mut |key: &ByStackKey, totals| {
            entries.push((*key, *totals));
        });
        if batched.is_ok() {
            return Ok(entries);
        }
        by_stack
            .iter()
            .map(|entry| entry.context("could not read BY_STACK"))
            .collect()
    }

    /// Every LIVE entry of process `tgid`: its outstanding blocks by
    /// address (`holders` scans for pointers to them), and how many
    /// entries went away while the table was walked (freed meanwhile).
    /// Read a batch of buckets per system call (BPF_MAP_LOOKUP_BATCH), or
    /// entry by entry on a kernel without it.
    pub fn live_blocks(&self, tgid: u32) -> Result<(Vec<(u64, LiveAlloc)>, u64)> {
        let map = self
            .ebpf
            .map(tracer_ebpf::map::LIVE)
            .context("eBPF object lacks LIVE")?;
        let live: KernelHashMap<&MapData, LiveKey, LiveAlloc> = KernelHashMap::try_from(map)?;
        let (mut blocks, mut gone) = (Vec::new(), 0);
        let batched = lookup_batches(live.map(), &mut |key: &LiveKey, block: &LiveAlloc| {
            if key.tgid == tgid {
                blocks.push((key.address, *block));
            }
        });
        if batched.is_err() {
            blocks.clear();
            // A key deleted under the walk sends the kernel's next-key back
            // to the first bucket: entries are met again (kept once), and
            // the walk is cut off after a bounded number of steps.
            let most_steps =
                4 * u64::from(live.map().info().map_or(1 << 20, |info| info.max_entries()));
            for entry in live.iter().take(most_steps as usize) {
                match entry {
                    Ok((key, block)) if key.tgid == tgid => blocks.push((key.address, block)),
                    Ok(_) => {}
                    Err(_) => gone += 1,
                }
            }
        }
        blocks.sort_unstable_by_key(|(address, _)| *address);
        blocks.dedup_by_key(|(address, _)| *address);
        Ok((blocks, gone))
    }

    /// When process `tgid` last replaced its image (execve) since attach:
    /// ktime ns, the clock of `LiveAlloc::timestamp_ns`.
    pub fn exec_time(&self, tgid: u32) -> Option<u64> {
        let times: KernelHashMap<&MapData, u32, u64> =
            KernelHashMap::try_from(self.ebpf.map(tracer_ebpf::map::EXEC_TIME)?).ok()?;
        times.get(&tgid, 0).ok()
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
    pub fn stack_apis(&self) -> Vec<(ByStackKey, u32)> {
        let Some(Ok(apis)) = self
            .ebpf
            .map(tracer_ebpf::map::STACK_API)
            .map(KernelHashMap::<&MapData, ByStackKey, u32>::try_from)
        else {
            return Vec::new();
        };
        apis.iter().filter_map(Result::ok).collect()
    }
}

/// The batch fields of `union bpf_attr` (BPF_MAP_*_BATCH).
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
/// Entries asked for per call.
const BATCH_ENTRIES: usize = 4096;

/// Calls `each` on every entry of hash map `map`, a batch of buckets per
/// BPF_MAP_LOOKUP_BATCH call (a bucket is read whole, so entries deleted
/// meanwhile do not restart the walk); Err when the kernel has no batch
/// lookup or a call failed (the entries given so far are then partial).
fn lookup_batches<K: Default + Clone, V: Default + Clone>(
    map: &MapData,
    each: &mut dyn FnMut(&K, &V),
) -> std::io::Result<()> {
    use std::os::fd::{AsFd as _, AsRawFd as _};
    let mut keys = vec![K::default(); BATCH_ENTRIES];
    let mut values = vec![V::default(); BATCH_ENTRIES];
    // The hash map's batch token: a bucket index.
    let (mut in_batch, mut out_batch) = (0u32, 0u32);
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { &raw const in_batch as u64 },
            out_batch: &raw mut out_batch as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: BATCH_ENTRIES as u32,
            map_fd: map.fd().as_fd().as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: the attribute points at buffers of BATCH_ENTRIES keys and
        // values of the map's own types, and at the two batch tokens, all
        // alive through the call; the kernel writes at most `count` entries.
        let result = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &raw mut attr,
                std::mem::size_of::<BatchAttr>(),
            )
        };
        let error = (result < 0).then(std::io::Error::last_os_error);
        let count = (attr.count as usize).min(BATCH_ENTRIES);
        for (key, value) in keys[..count].iter().zip(&values[..count]) {
            each(key, value);
        }
        match error {
            None => {}
            Some(error) if error.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
            // No batch lookup, or a bucket over BATCH_ENTRIES entries: the
            // caller walks entry by entry instead.
            Some(error) => return Err(error),
        }
        in_batch = out_batch;
        first = false;
    }
}
