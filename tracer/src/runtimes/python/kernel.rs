//! The kernel's Python maps (`tracer-ebpf/src/python.rs`): turning the
//! Python-frame walk on for a process, its threads' thread states, and the
//! threads whose allocations got native frames only.
use anyhow::{Context as _, Result};
use aya::maps::{Array, HashMap as KernelHashMap, MapData};
use tracer_ebpf::{PythonOffsets, PythonThreadMiss, map, python_setting};

use crate::attach::Probes;

/// Walks the Python frames of `pid`'s threads from now on, laid out as
/// `offsets`, up to `depth` frames per stack.
pub fn start(probes: &mut Probes, pid: u32, offsets: PythonOffsets, depth: u32) -> Result<()> {
    let mut per_process: KernelHashMap<_, u32, PythonOffsets> =
        KernelHashMap::try_from(probes.kernel_map_mut(map::PYTHON_OFFSETS)?)?;
    per_process
        .insert(pid, offsets, 0)
        .with_context(|| format!("could not ask for the Python frames of PID {pid}"))?;
    let mut settings: Array<_, u32> = Array::try_from(probes.kernel_map_mut(map::PYTHON_ON)?)?;
    settings.set(python_setting::DEPTH, depth, 0)?;
    settings.set(python_setting::ON, 1, 0)?;
    Ok(())
}

/// Makes the kernel's thread states of `pid` those of `threads`
/// (thread id, `PyThreadState` address); `known` are the thread ids
/// set before, for `pid`, removed when they are gone.
pub fn set_threads(probes: &mut Probes, threads: &[(u32, u64)], gone: &[u32]) -> Result<()> {
    let mut map: KernelHashMap<_, u32, u64> =
        KernelHashMap::try_from(probes.kernel_map_mut(map::PYTHON_THREADS)?)?;
    for tid in gone {
        let _ = map.remove(tid);
    }
    for &(tid, thread_state) in threads {
        if map.get(&tid, 0).ok() != Some(thread_state) {
            map.insert(tid, thread_state, 0)
                .context("could not store a Python thread state")?;
        }
    }
    Ok(())
}

/// The threads whose thread state the kernel holds (userspace's and
/// those the kernel found itself).
pub fn threads(probes: &Probes) -> Vec<u32> {
    probes
        .kernel_map(map::PYTHON_THREADS)
        .ok()
        .and_then(|map| KernelHashMap::<&MapData, u32, u64>::try_from(map).ok())
        .map(|threads| threads.keys().filter_map(Result::ok).collect())
        .unwrap_or_default()
}

/// The threads of Python processes whose allocations got native
/// frames only (thread state not found then), with how many.
pub fn missed(probes: &Probes) -> Vec<(u32, u64)> {
    probes
        .kernel_map(map::PYTHON_MISSED)
        .ok()
        .and_then(|map| KernelHashMap::<&MapData, u32, PythonThreadMiss>::try_from(map).ok())
        .map(|missed| {
            missed
                .iter()
                .filter_map(Result::ok)
                .map(|(tid, miss)| (tid, miss.allocations))
                .collect()
        })
        .unwrap_or_default()
}
