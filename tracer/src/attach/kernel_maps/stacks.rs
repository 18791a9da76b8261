//! The kernel's stack tables as their eviction sees them
//! (`collect::stack_table` has the protocol): the frames of a stack id
//! and of a Python stack id, the ids a call in progress still holds, and
//! the writes that evict (a hash unlinked, an id's entries deleted, the id
//! given back) and that read the Python stacks stored since the last call.
use std::collections::HashSet;

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    maps::{HashMap as KernelHashMap, IterableMap as _, MapData, Queue},
};
use tracer_ebpf::{
    ByStackKey, MappingEvent, NO_STACK, Pending, PythonStack, SignalLevel, StackFrames,
    StackTotals, is_copied_stack, map,
};

use crate::attach::Probes;

/// Reads and writes the stack tables of a loaded object.
pub struct StackMaps<'a> {
    ebpf: &'a mut Ebpf,
}

impl Probes {
    /// How many stacks STACKS holds (`--max-stacks`).
    pub fn stack_capacity(&self) -> u32 {
        self.ebpf
            .map(map::STACKS)
            .and_then(|map| KernelHashMap::<&MapData, u32, StackFrames>::try_from(map).ok())
            .and_then(|stacks| stacks.map().info().ok())
            .map_or(1 << 17, |info| info.max_entries())
    }

    /// A map of the loaded object, by its name (`tracer_ebpf::map`), for
    /// a runtime's own maps (`runtimes::python::kernel`).
    pub fn kernel_map(&self, name: &str) -> Result<&aya::maps::Map> {
        self.ebpf
            .map(name)
            .with_context(|| format!("eBPF object lacks {name}"))
    }

    /// The same, to write.
    pub fn kernel_map_mut(&mut self, name: &str) -> Result<&mut aya::maps::Map> {
        self.ebpf
            .map_mut(name)
            .with_context(|| format!("eBPF object lacks {name}"))
    }

    /// The stack tables, to evict from.
    pub fn stack_maps(&mut self) -> StackMaps<'_> {
        StackMaps {
            ebpf: &mut self.ebpf,
        }
    }
}

impl StackMaps<'_> {
    fn hash_map<K: aya::Pod, V: aya::Pod>(
        &mut self,
        name: &str,
    ) -> Result<KernelHashMap<&mut MapData, K, V>> {
        let map = self
            .ebpf
            .map_mut(name)
            .with_context(|| format!("eBPF object lacks {name}"))?;
        Ok(KernelHashMap::try_from(map)?)
    }

    fn queue(&mut self, name: &str) -> Result<Queue<&mut MapData, u32>> {
        let map = self
            .ebpf
            .map_mut(name)
            .with_context(|| format!("eBPF object lacks {name}"))?;
        Ok(Queue::try_from(map)?)
    }

    /// The STACKS entry of `id`, when there is one.
    pub fn stack(&mut self, id: u32) -> Option<StackFrames> {
        self.hash_map::<u32, StackFrames>(map::STACKS)
            .ok()?
            .get(&id, 0)
            .ok()
    }

    /// The PYTHON_STACKS entry of `id`, when there is one.
    pub fn stored_stack(&mut self, id: u32) -> Option<PythonStack> {
        self.hash_map::<u32, PythonStack>(map::PYTHON_STACKS)
            .ok()?
            .get(&id, 0)
            .ok()
    }

    /// Removes `hash` from STACK_IDS (or PYTHON_STACK_IDS, `python`) when
    /// it names `id`: no walk finds the id from then on. Only the kernel
    /// adds entries there, never over one, so the entry read is the one
    /// removed.
    pub fn unlink(&mut self, stored: bool, hash: u64, id: u32) -> Result<()> {
        let name = if stored {
            map::PYTHON_STACK_IDS
        } else {
            map::STACK_IDS
        };
        let mut ids = self.hash_map::<u64, u32>(name)?;
        if ids.get(&hash, 0).ok() == Some(id) {
            ids.remove(&hash)
                .with_context(|| format!("could not unlink stack {id} from {name}"))?;
        }
        Ok(())
    }

    /// Deletes stack `id`: its BY_STACK entries `keys` (and their
    /// STACK_API entries, for GPU memory), then its frames; and gives the
    /// id back for a new stack.
    pub fn evict_stack(&mut self, id: u32, keys: &[ByStackKey]) -> Result<()> {
        let mut by_stack = self.hash_map::<ByStackKey, StackTotals>(map::BY_STACK)?;
        for key in keys {
            let _ = by_stack.remove(key);
        }
        let mut apis = self.hash_map::<ByStackKey, u32>(map::STACK_API)?;
        for key in keys.iter().filter(|key| is_gpu_kind(key.kind)) {
            let _ = apis.remove(key);
        }
        let _ = self.hash_map::<u32, StackFrames>(map::STACKS)?.remove(&id);
        self.queue(map::STACK_FREE_IDS)?
            .push(id, 0)
            .with_context(|| format!("could not give stack id {id} back"))
    }

    /// Deletes Python stack `id` and gives the id back.
    pub fn evict_stored_stack(&mut self, id: u32) -> Result<()> {
        let _ = self
            .hash_map::<u32, PythonStack>(map::PYTHON_STACKS)?
            .remove(&id);
        self.queue(map::PYTHON_FREE_IDS)?
            .push(id, 0)
            .with_context(|| format!("could not give Python stack id {id} back"))
    }

    /// The ids of the Python stacks stored since the last call, oldest
    /// first.
    pub fn new_stored_ids(&mut self) -> Vec<u32> {
        let Ok(mut queue) = self.queue(map::PYTHON_NEW_IDS) else {
            return Vec::new();
        };
        std::iter::from_fn(|| queue.pop(0).ok()).collect()
    }

    /// The stack ids that calls in progress hold outside BY_STACK: a
    /// realloc's old block, taken off at its entry and put back if the
    /// call fails (PENDING, and SIGNAL_SAVED for one a signal handler
    /// interrupted), and a mapping call's stack, from its entry to its
    /// exit (MAPPING_PENDING).
    pub fn held_by_calls(&mut self) -> Result<HashSet<u32>> {
        let mut held = HashSet::new();
        let reallocs = |pending: &Pending| (pending.old_known != 0).then_some(pending.old.stack_id);
        let map = self
            .ebpf
            .map(map::PENDING)
            .context("eBPF object lacks PENDING")?;
        let pending: KernelHashMap<&MapData, u64, Pending> = KernelHashMap::try_from(map)?;
        held.extend(
            pending
                .iter()
                .filter_map(Result::ok)
                .filter_map(|(_, p)| reallocs(&p)),
        );
        let map = self
            .ebpf
            .map(map::SIGNAL_SAVED)
            .context("eBPF object lacks SIGNAL_SAVED")?;
        let saved: KernelHashMap<&MapData, SignalLevel, Pending> = KernelHashMap::try_from(map)?;
        held.extend(
            saved
                .iter()
                .filter_map(Result::ok)
                .filter_map(|(_, p)| reallocs(&p)),
        );
        let map = self
            .ebpf
            .map(map::MAPPING_PENDING)
            .context("eBPF object lacks MAPPING_PENDING")?;
        let mappings: KernelHashMap<&MapData, u64, MappingEvent> = KernelHashMap::try_from(map)?;
        held.extend(
            mappings
                .iter()
                .filter_map(Result::ok)
                .map(|(_, event)| event.stack_id),
        );
        held.retain(|&id| id != NO_STACK && !is_copied_stack(id));
        Ok(held)
    }
}

/// Whether a raw kind is GPU memory (the kinds STACK_API names).
fn is_gpu_kind(kind: u32) -> bool {
    matches!(
        kind,
        tracer_ebpf::kind::GPU_DEVICE
            | tracer_ebpf::kind::GPU_MANAGED
            | tracer_ebpf::kind::GPU_HOST_PINNED
    )
}
