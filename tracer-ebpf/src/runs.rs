//! Each program counts its own runs and times a sample of them
//! (`tracer_ebpf::ProgramRuns`), so that tracer never needs the kernel's
//! run-time stats, which are host-wide.
use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::map, maps::PerCpuArray};
use tracer_ebpf::{ProgramRuns, TIMED_EVERY, counted};

use crate::counters::{atomic_add, fetch_add};

/// Runs by program id (`tracer_ebpf::counted`), per CPU.
#[map]
static PROGRAM_RUNS: PerCpuArray<ProgramRuns> = PerCpuArray::with_max_entries(counted::COUNT, 0);

/// Runs `body` as program `id`: counts the run, and times it when it is
/// the first of [`TIMED_EVERY`] on this CPU. The start time waits in the
/// map rather than in a register, so the body is verified once, not once
/// timed and once not.
#[inline(always)]
pub(crate) fn counted_run(id: u32, body: impl FnOnce() -> u32) -> u32 {
    start_run(id);
    let verdict = body();
    end_run(id);
    verdict
}

#[inline(always)]
fn start_run(id: u32) {
    let Some(runs) = PROGRAM_RUNS.get_ptr_mut(id) else {
        return;
    };
    // Atomic: a thread preempted inside its program may share the CPU
    // with another running the same one.
    let before = fetch_add(unsafe { &raw mut (*runs).runs }, 1);
    if before % TIMED_EVERY == 0 {
        unsafe { (*runs).started_ns = bpf_ktime_get_ns() };
    }
}

#[inline(always)]
fn end_run(id: u32) {
    let Some(runs) = PROGRAM_RUNS.get_ptr_mut(id) else {
        return;
    };
    let started_ns = unsafe { (*runs).started_ns };
    if started_ns == 0 {
        return;
    }
    unsafe { (*runs).started_ns = 0 };
    let elapsed_ns = unsafe { bpf_ktime_get_ns() }.saturating_sub(started_ns);
    atomic_add(unsafe { &raw mut (*runs).timed_ns }, elapsed_ns);
    atomic_add(unsafe { &raw mut (*runs).timed_runs }, 1);
}
