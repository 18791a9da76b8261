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

use tracer_ebpf::{FIRST_CONTEXT_EPOCH, RareEvent, StackTotals};

use crate::model::{ContextDestroyed, Counters, Kind, StackId, StackKey, Target, Totals};

/// The totals of one stack in one CUDA context epoch (0: memory no
/// context owns), as the kernel's BY_STACK keeps them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpochEntry {
    pub key: StackKey,
    pub context_epoch: u32,
    /// Live counters are two's-complement sums of signed changes.
    pub counters: Counters,
}

impl EpochEntry {
    /// A BY_STACK entry of the kernel's; `None` for a kind this build does
    /// not know.
    pub fn from_kernel(key: &tracer_ebpf::ByStackKey, totals: &StackTotals) -> Option<EpochEntry> {
        Some(EpochEntry {
            key: StackKey {
                pid: key.tgid,
                stack_id: match key.stack_id {
                    tracer_ebpf::NO_STACK => StackId::Lost,
                    id => StackId::Kernel(id),
                },
                kind: Kind::from_raw(key.kind)?,
            },
            context_epoch: key.context_epoch,
            counters: Counters {
                live_bytes: totals.live_bytes as i64,
                live_allocs: totals.live_allocs as i64,
                alloc_bytes_total: totals.alloc_bytes,
                alloc_count_total: totals.alloc_count,
            },
        })
    }
}

/// The per-epoch entries as the model's stacks: the epochs of a stack
/// summed into one, without the live counters of ended epochs (the memory
/// a context destruction released). `current_epochs` holds the epoch of
/// each process that ended one.
pub fn fold_epochs(
    entries: impl IntoIterator<Item = EpochEntry>,
    current_epochs: &HashMap<u32, u32>,
) -> HashMap<StackKey, Counters> {
    let mut by_key: HashMap<StackKey, Counters> = HashMap::new();
    for entry in entries {
        let current_epoch = current_epochs
            .get(&entry.key.pid)
            .copied()
            .unwrap_or(FIRST_CONTEXT_EPOCH);
        let released = entry.context_epoch != 0 && entry.context_epoch < current_epoch;
        let counters = by_key.entry(entry.key).or_default();
        if !released {
            counters.live_bytes += entry.counters.live_bytes;
            counters.live_allocs += entry.counters.live_allocs;
        }
        counters.alloc_bytes_total += entry.counters.alloc_bytes_total;
        counters.alloc_count_total += entry.counters.alloc_count_total;
    }
    by_key
}

/// What the entries of one process's ended epoch held, by kind name (kinds
/// that held nothing left out).
fn released_by(entries: &[EpochEntry], tgid: u32, ended_epoch: u32) -> BTreeMap<String, Totals> {
    let mut released: BTreeMap<String, Totals> = BTreeMap::new();
    for entry in entries {
        if entry.key.pid != tgid || entry.context_epoch != ended_epoch {
            continue;
        }
        let sum = released
            .entry(entry.key.kind.as_str().to_owned())
            .or_default();
        sum.live_bytes += entry.counters.live_bytes;
        sum.live_allocs += entry.counters.live_allocs;
    }
    released.retain(|_, totals| *totals != Totals::default());
    released
}

/// Adds a context destruction (an EVENTS message) to its target, with what
/// the epoch it ended held in `entries` (every copy sent before it drained
/// first). Returns what was added; `None` for a process that is not a
/// target.
pub fn mark_destroyed<'a>(
    entries: &[EpochEntry],
    destroyed: &RareEvent,
    attached_at: Instant,
    target: &'a mut Target,
) -> &'a ContextDestroyed {
    let released = released_by(entries, destroyed.tgid, destroyed.context_epoch);
    // The kernel's clock says when the call returned, however late the
    // event is read.
    let age_s = crate::procfs::monotonic_ns().saturating_sub(destroyed.timestamp_ns) as f64 / 1e9;
    let list = &mut target.gpu_contexts_destroyed;
    list.push(ContextDestroyed {
        after_s: (attached_at.elapsed().as_secs_f64() - age_s).max(0.0),
        released,
    });
    list.last().expect("just pushed")
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
    ) -> EpochEntry {
        EpochEntry::from_kernel(
            &tracer_ebpf::ByStackKey {
                tgid,
                stack_id: 7,
                kind,
                context_epoch,
            },
            &StackTotals {
                live_bytes: live_bytes as u64,
                live_allocs: (live_bytes != 0) as u64,
                alloc_bytes,
                alloc_count: 1,
            },
        )
        .expect("a known kind")
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
        let mut stacks: Vec<(StackKey, Counters)> =
            fold_epochs(entries, &epochs).into_iter().collect();
        stacks.sort_by_key(|(key, _)| *key);
        assert_eq!(stacks.len(), 2);
        let (key, counters) = stacks[0];
        assert_eq!(
            (key.pid, key.stack_id, key.kind),
            (10, StackId::Kernel(7), Kind::GpuDevice)
        );
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

    #[test]
    fn an_unknown_kind_is_left_out() {
        let key = tracer_ebpf::ByStackKey {
            tgid: 1,
            stack_id: 2,
            kind: 63,
            context_epoch: 0,
        };
        assert_eq!(EpochEntry::from_kernel(&key, &StackTotals::default()), None);
    }
}
