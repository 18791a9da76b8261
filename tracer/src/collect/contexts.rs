//! CUDA context destruction, as collect sees it. Destroying or resetting a
//! context (cuCtxDestroy_v2, cuDevicePrimaryCtxReset_v2, cudaDeviceReset)
//! releases the GPU memory it owned without a free, so the kernel ends the
//! process's context epoch (exec ends it too): blocks carry the epoch they
//! were allocated in, BY_STACK sums each epoch apart, and every later free
//! of an older block is ignored. An ended epoch's entries are therefore
//! frozen at what was live when the call returned: the report reads them
//! exactly however late it looks, and every snapshot leaves them out.
//!
//! Which context a block belongs to is not followed (the CUDA runtime
//! switches contexts through the driver's internal entry points): any
//! destruction releases every context-owned block of the process allocated
//! before it. Exact for a process with one context at a time, the primary
//! context of PyTorch, TensorFlow and TVM included.
use std::{
    collections::{BTreeMap, HashMap},
    time::Instant,
};

use anyhow::{Context as _, Result};
use aya::maps::{HashMap as KernelHashMap, MapData};
use tracer_ebpf::{Event, FIRST_CONTEXT_EPOCH, StackTotals};

use super::{Watched, stack_entries};
use crate::{
    attach::Probes,
    model::{ContextDestroyed, Counters, Kind, StackKey, Totals},
};

/// The current context epoch of each process that ended one (the others
/// are at `FIRST_CONTEXT_EPOCH`).
pub fn epochs(probes: &Probes) -> Result<HashMap<u32, u32>> {
    let epochs: KernelHashMap<&MapData, u32, u64> = KernelHashMap::try_from(
        probes
            .ebpf
            .map("CONTEXT_EPOCH")
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

/// The kernel's per-stack entries as the model's stacks: the epochs of a
/// stack summed into one, without the live counters of ended epochs (the
/// memory a context destruction released). Kinds this build does not know
/// are left out.
pub fn fold_epochs(
    entries: Vec<(tracer_ebpf::StackKey, StackTotals)>,
    current_epochs: &HashMap<u32, u32>,
) -> Vec<(StackKey, Counters)> {
    let mut by_key: HashMap<StackKey, Counters> = HashMap::new();
    for (key, totals) in entries {
        let Some(kind) = Kind::from_raw(key.kind) else {
            continue;
        };
        let current_epoch = current_epochs
            .get(&key.tgid)
            .copied()
            .unwrap_or(FIRST_CONTEXT_EPOCH);
        let released = key.context_epoch != 0 && key.context_epoch < current_epoch;
        let counters = by_key
            .entry(StackKey {
                pid: key.tgid,
                stack_id: key.stack_id,
                kind,
            })
            .or_default();
        if !released {
            // Two's-complement sums of signed changes.
            counters.live_bytes += totals.live_bytes as i64;
            counters.live_allocs += totals.live_allocs as i64;
        }
        counters.alloc_bytes_total += totals.alloc_bytes;
        counters.alloc_count_total += totals.alloc_count;
    }
    by_key.into_iter().collect()
}

/// What the entries of one process's ended epoch held, by kind name (kinds
/// that held nothing left out).
fn released_by(
    entries: &[(tracer_ebpf::StackKey, StackTotals)],
    tgid: u32,
    ended_epoch: u32,
) -> BTreeMap<String, Totals> {
    let mut released: BTreeMap<String, Totals> = BTreeMap::new();
    for (key, totals) in entries {
        if key.tgid != tgid || key.context_epoch != ended_epoch {
            continue;
        }
        if let Some(kind) = Kind::from_raw(key.kind) {
            let sum = released.entry(kind.as_str().to_owned()).or_default();
            sum.live_bytes += totals.live_bytes as i64;
            sum.live_allocs += totals.live_allocs as i64;
        }
    }
    released.retain(|_, totals| *totals != Totals::default());
    released
}

/// Adds a context destruction (an EVENTS message) to its target, with what
/// the epoch it ended held. Returns what was added; `None` for a process
/// that is not a target.
pub fn mark_destroyed<'a>(
    probes: &Probes,
    destroyed: &Event,
    attached_at: Instant,
    targets: &'a mut [Watched],
) -> Result<Option<&'a ContextDestroyed>> {
    let Some(watched) = targets
        .iter_mut()
        .find(|watched| watched.target.pid == destroyed.tgid)
    else {
        return Ok(None);
    };
    // With the blocks of copied stacks, every copy sent before the
    // destruction drained first.
    let released = released_by(
        &stack_entries(probes)?,
        destroyed.tgid,
        destroyed.context_epoch,
    );
    // The kernel's clock says when the call returned, however late the
    // event is read.
    let age_s = monotonic_ns().saturating_sub(destroyed.timestamp_ns) as f64 / 1e9;
    let list = &mut watched.target.gpu_contexts_destroyed;
    list.push(ContextDestroyed {
        after_s: (attached_at.elapsed().as_secs_f64() - age_s).max(0.0),
        released,
    });
    Ok(list.last())
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of the kernel's timestamps
/// (`bpf_ktime_get_ns`).
fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec; CLOCK_MONOTONIC always
    // exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_ebpf::kind;

    fn entry(
        tgid: u32,
        kind: u32,
        context_epoch: u32,
        live_bytes: i64,
        alloc_bytes: u64,
    ) -> (tracer_ebpf::StackKey, StackTotals) {
        (
            tracer_ebpf::StackKey {
                tgid,
                stack_id: 7,
                kind,
                context_epoch,
            },
            StackTotals {
                live_bytes: live_bytes as u64,
                live_allocs: (live_bytes != 0) as u64,
                alloc_bytes,
                alloc_count: 1,
            },
        )
    }

    #[test]
    fn ended_epochs_are_released_and_a_stacks_epochs_are_one_stack() {
        let entries = vec![
            // Epoch 1 ended: released, still counted as allocated.
            entry(10, kind::GPU_DEVICE, 1, 4096, 4096),
            // Epoch 2 is current; a free of one of its blocks is negative.
            entry(10, kind::GPU_DEVICE, 2, 8192, 8192),
            entry(10, kind::GPU_DEVICE, 2, -1024, 0),
            // No context owns it: never released.
            entry(10, kind::GPU_DEVICE, 0, 100, 100),
            // Another process, still in its first epoch.
            entry(11, kind::GPU_DEVICE, 1, 300, 300),
        ];
        let epochs = HashMap::from([(10, 2)]);
        let mut stacks = fold_epochs(entries, &epochs);
        stacks.sort_by_key(|(key, _)| *key);
        assert_eq!(stacks.len(), 2);
        let (key, counters) = stacks[0];
        assert_eq!((key.pid, key.stack_id, key.kind), (10, 7, Kind::GpuDevice));
        assert_eq!(counters.live_bytes, 8192 - 1024 + 100);
        assert_eq!(counters.alloc_bytes_total, 4096 + 8192 + 100);
        assert_eq!(counters.alloc_count_total, 4);
        assert_eq!(stacks[1].1.live_bytes, 300);
    }

    #[test]
    fn released_sums_the_ended_epoch_of_one_process_by_kind() {
        let entries = vec![
            entry(10, kind::GPU_DEVICE, 1, 4096, 4096),
            entry(10, kind::GPU_HOST_PINNED, 1, 512, 512),
            entry(10, kind::GPU_MANAGED, 1, 0, 64),
            entry(10, kind::GPU_DEVICE, 2, 8192, 8192),
            entry(11, kind::GPU_DEVICE, 1, 300, 300),
        ];
        let released = released_by(&entries, 10, 1);
        let bytes: Vec<(&str, i64)> = released
            .iter()
            .map(|(kind, totals)| (kind.as_str(), totals.live_bytes))
            .collect();
        assert_eq!(bytes, [("gpu-device", 4096), ("gpu-host-pinned", 512)]);
    }
}
