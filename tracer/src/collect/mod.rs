//! The collection loop (tokio): every interval, snapshot the kernel's
//! per-stack totals and counters into the model; watch the targets (and
//! hook the libraries they load); stop on --duration, Ctrl-C, SIGTERM or
//! when every target has exited.
//!
//! Reading BY_STACK costs one syscall pair per stack, never per allocation,
//! so tracer's own cost does not grow with the target's allocation rate.
//! Mapping calls arrive one by one in a ring buffer (`mappings`), drained
//! every [`MAPPING_DRAIN_EVERY`] and at every snapshot.
mod contexts;
pub mod copied;
pub mod mappings;

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    maps::{HashMap, MapData, PerCpuArray, StackTraceMap},
};
use tokio::signal::unix::{SignalKind, signal};
use tracer_ebpf::{StackTotals, stat};

use crate::{
    attach::{Probes, libraries, spawn},
    model::{Counters, Frame, Kind, Model, Snapshot, StackKey, Target},
    recording,
    symbolize::Symbols,
};

/// How often targets are checked for exit.
const LIVENESS_EVERY: Duration = Duration::from_millis(100);
/// How often the mapping events are drained: often enough that the 1 MiB
/// ring buffer holds a burst (~12 k calls) between two drains.
pub const MAPPING_DRAIN_EVERY: Duration = Duration::from_millis(20);

/// How often stack copies are drained and unwound (`--unwind dwarf`): a
/// 16 MiB ring holds about 1 000 copies of 16 KiB.
pub const COPIES_DRAIN_EVERY: Duration = Duration::from_millis(5);

/// Why collection stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    Duration,
    Interrupted,
    Terminated,
    TargetsExited,
}

/// A traced process and how to notice its exit.
pub struct Watched {
    pub target: Target,
    /// Started by tracer: reaped with waitpid, not just looked up.
    pub spawned: bool,
}

impl Watched {
    fn has_exited(&self) -> bool {
        if self.spawned {
            spawn::reap_if_exited(self.target.pid)
        } else {
            !crate::procfs::is_alive(self.target.pid)
        }
    }
}

/// Settings of the loop.
pub struct Schedule {
    pub interval: Duration,
    pub duration: Option<Duration>,
    /// When the probes were in place: time zero of every series.
    pub attached_at: Instant,
    /// How often to print a status line on stderr (None: never).
    pub status_every: Option<Duration>,
    /// Attach to the children the targets fork (`--follow-forks`).
    pub follow_forks: bool,
}

/// Called after every snapshot, with the model and the symbolizer (for
/// views that refresh while tracing: the SVG, `tracer top`).
pub type OnSnapshot<'a> = dyn FnMut(&Probes, &Model, &mut Symbols, &[Watched]) -> Result<()> + 'a;

/// Runs until a stop condition; the model holds a final snapshot taken
/// after it. Every snapshot and target exit also goes to the recording, if
/// there is one.
pub async fn run(
    probes: &mut Probes,
    targets: &mut Vec<Watched>,
    model: &mut Model,
    symbols: &mut Symbols,
    schedule: &Schedule,
    on_snapshot: &mut OnSnapshot<'_>,
    mut recording: Option<&mut recording::Writer>,
) -> Result<StopReason> {
    let mut interrupt = signal(SignalKind::interrupt()).context("could not catch SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("could not catch SIGTERM")?;
    let mut snapshot_timer = tokio::time::interval(schedule.interval);
    snapshot_timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut liveness_timer = tokio::time::interval(LIVENESS_EVERY);
    let mut library_timer = tokio::time::interval(libraries::DRAIN_EVERY);
    let mut drain_timer = tokio::time::interval(MAPPING_DRAIN_EVERY);
    let mut copies_timer = tokio::time::interval(COPIES_DRAIN_EVERY);
    let deadline = schedule
        .duration
        .map(|duration| schedule.attached_at + duration);
    let mut last_status = Instant::now();
    // Live counters of the stacks of images replaced by exec, subtracted
    // from every later snapshot: that memory is gone.
    let mut exec_baselines: std::collections::HashMap<StackKey, Counters> =
        std::collections::HashMap::new();

    let reason = loop {
        let until_deadline = async {
            match deadline {
                Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = snapshot_timer.tick() => {
                for watched in targets.iter().filter(|w| w.target.exited_after_s.is_none()) {
                    symbols.refresh(watched.target.pid);
                }
                let snapshot = snapshot(probes, schedule.attached_at, &live_pids(targets), &exec_baselines)?;
                if let Some(writer) = recording.as_deref_mut() {
                    record_snapshot(writer, probes, symbols, &snapshot)?;
                }
                model.push(snapshot);
                if let Some(every) = schedule.status_every && last_status.elapsed() >= every {
                    last_status = Instant::now();
                    eprintln!("{}", status_line(model));
                }
                on_snapshot(probes, model, symbols, targets)?;
            }
            _ = library_timer.tick() => {
                probes.watch_libraries(&live_pids(targets));
                mark_rare_events(probes, targets, symbols, schedule, &mut exec_baselines)?;
            }
            _ = drain_timer.tick() => {
                probes.mappings.borrow_mut().drain(&mut probes.copied.borrow_mut());
            }
            _ = copies_timer.tick(), if probes.unwinding.copy_mode() != 0 => {
                probes.copied.borrow_mut().drain();
            }
            _ = liveness_timer.tick() => {
                let elapsed_s = schedule.attached_at.elapsed().as_secs_f64();
                if schedule.follow_forks {
                    follow_children(probes, targets, symbols, elapsed_s, schedule.status_every.is_some());
                }
                for watched in targets.iter_mut().filter(|w| w.target.exited_after_s.is_none()) {
                    if watched.has_exited() {
                        watched.target.exited_after_s = Some(elapsed_s);
                        if let Some(writer) = recording.as_deref_mut() {
                            writer.append_exit(watched.target.pid, elapsed_s)?;
                        }
                        if schedule.status_every.is_some() {
                            eprintln!("tracer: PID {} exited after {elapsed_s:.1} s", watched.target.pid);
                        }
                    }
                }
                if targets.iter().all(|w| w.target.exited_after_s.is_some()) {
                    break StopReason::TargetsExited;
                }
            }
            _ = until_deadline => break StopReason::Duration,
            _ = interrupt.recv() => break StopReason::Interrupted,
            _ = terminate.recv() => break StopReason::Terminated,
        }
    };
    // Events sent since the last drain, before the final snapshot; and
    // the libraries mapped since the last snapshot, for the symbolizer.
    probes.watch_libraries(&live_pids(targets));
    mark_rare_events(probes, targets, symbols, schedule, &mut exec_baselines)?;
    for pid in live_pids(targets) {
        symbols.refresh(pid);
    }
    let snapshot = snapshot(
        probes,
        schedule.attached_at,
        &live_pids(targets),
        &exec_baselines,
    )?;
    if let Some(writer) = recording {
        record_snapshot(writer, probes, symbols, &snapshot)?;
    }
    model.push(snapshot);
    Ok(reason)
}

/// Marks the execs and CUDA context destructions the last
/// `watch_libraries` saw.
fn mark_rare_events(
    probes: &mut Probes,
    targets: &mut [Watched],
    symbols: &mut Symbols,
    schedule: &Schedule,
    exec_baselines: &mut std::collections::HashMap<StackKey, Counters>,
) -> Result<()> {
    let elapsed_s = schedule.attached_at.elapsed().as_secs_f64();
    for pid in probes.take_execs() {
        mark_exec(probes, pid, elapsed_s, targets, exec_baselines)?;
        symbols.refresh(pid);
    }
    for destroyed in probes.take_context_destroys() {
        let marked = contexts::mark_destroyed(probes, &destroyed, schedule.attached_at, targets)?;
        if let Some(marked) = marked
            && schedule.status_every.is_some()
        {
            eprintln!(
                "tracer: PID {} destroyed or reset a CUDA context after {:.1} s",
                destroyed.tgid, marked.after_s
            );
        }
    }
    Ok(())
}

/// Notes that `pid` replaced its image: marks the boundary in its target
/// and takes the live counters of its stacks so far off every later
/// snapshot (the kernel ignores frees of the old image's blocks).
fn mark_exec(
    probes: &Probes,
    pid: u32,
    elapsed_s: f64,
    targets: &mut [Watched],
    baselines: &mut std::collections::HashMap<StackKey, Counters>,
) -> Result<()> {
    for (key, counters) in snapshot(probes, Instant::now(), &[], baselines)?.stacks {
        if key.pid == pid {
            let baseline = baselines.entry(key).or_default();
            baseline.live_bytes += counters.live_bytes;
            baseline.live_allocs += counters.live_allocs;
        }
    }
    if let Some(watched) = targets.iter_mut().find(|watched| watched.target.pid == pid) {
        watched.target.execs_after_s.push(elapsed_s);
        watched.target.command = crate::procfs::command_line(pid);
    }
    Ok(())
}

/// Every BY_STACK entry, as the kernel keeps it.
/// Every per-stack entry in the shape of BY_STACK's: the kernel's, and
/// those userspace keeps for blocks with copied stacks (`--unwind dwarf`),
/// after draining every copy sent so far.
fn stack_entries(probes: &Probes) -> Result<Vec<(tracer_ebpf::StackKey, StackTotals)>> {
    let by_stack: HashMap<&MapData, tracer_ebpf::StackKey, StackTotals> = HashMap::try_from(
        probes
            .ebpf
            .map("BY_STACK")
            .context("eBPF object lacks BY_STACK")?,
    )?;
    let mut entries = by_stack
        .iter()
        .map(|entry| entry.context("could not read BY_STACK"))
        .collect::<Result<Vec<_>>>()?;
    let mut copied = probes.copied.borrow_mut();
    copied.drain();
    entries.extend(copied.as_kernel_entries());
    Ok(entries)
}

/// Appends a snapshot to the recording, after the libraries hooked since
/// the last one, with the frames and CUDA API of the stacks it shows first.
fn record_snapshot(
    writer: &mut recording::Writer,
    probes: &Probes,
    symbols: &mut Symbols,
    snapshot: &Snapshot,
) -> Result<()> {
    writer.append_libraries(&probes.library_reports())?;
    let apis = stack_apis(probes);
    writer.append_snapshot(snapshot, &mut |key| {
        (
            stack_frames(probes, symbols, key),
            apis.get(key).map(|api| (*api).to_owned()),
        )
    })
}

/// Attaches to the processes the followed targets forked since the last
/// call, and follows their children in turn. New threads are announced
/// too and skipped here; a child that exits before the probes are in
/// place is skipped.
fn follow_children(
    probes: &mut Probes,
    targets: &mut Vec<Watched>,
    symbols: &mut Symbols,
    elapsed_s: f64,
    verbose: bool,
) {
    for child in probes.take_forks() {
        let is_process = crate::procfs::tgid(child) == Some(child);
        if !is_process || targets.iter().any(|watched| watched.target.pid == child) {
            continue;
        }
        if let Err(error) = probes.attach_allocators(child) {
            if verbose && crate::procfs::is_alive(child) {
                eprintln!("tracer: warning: could not follow child PID {child}: {error:#}");
            }
            continue;
        }
        if let Err(error) = probes.trace_mappings(child)
            && verbose
        {
            eprintln!("tracer: warning: mappings of child PID {child} not followed: {error:#}");
        }
        if probes.follow(child).is_err() && verbose {
            eprintln!("tracer: warning: the children of PID {child} will not be followed");
        }
        symbols.refresh(child);
        let command = crate::procfs::command_line(child);
        if verbose {
            eprintln!("tracer: following child PID {child} ({command}) after {elapsed_s:.1} s");
        }
        targets.push(Watched {
            target: Target {
                pid: child,
                command,
                exited_after_s: None,
                followed_after_s: Some(elapsed_s),
                execs_after_s: Vec::new(),
                gpu_contexts_destroyed: Vec::new(),
            },
            spawned: false,
        });
    }
}

fn live_pids(targets: &[Watched]) -> Vec<u32> {
    targets
        .iter()
        .filter(|watched| watched.target.exited_after_s.is_none())
        .map(|watched| watched.target.pid)
        .collect()
}

/// Waits for SIGINT, SIGTERM or the exit of `pid`.
pub async fn wait_for_stop(pid: u32) -> Result<()> {
    let mut interrupt = signal(SignalKind::interrupt()).context("could not catch SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("could not catch SIGTERM")?;
    let mut liveness_timer = tokio::time::interval(LIVENESS_EVERY);
    loop {
        tokio::select! {
            _ = liveness_timer.tick() => {
                if !crate::procfs::is_alive(pid) {
                    return Ok(());
                }
            }
            _ = interrupt.recv() => return Ok(()),
            _ = terminate.recv() => return Ok(()),
        }
    }
}

/// Reads BY_STACK and STATS, the mapping kinds' counters and the RSS of
/// the live targets. The live counters of `exec_baselines` (images
/// replaced by exec) are taken off, and so are those of ended CUDA context
/// epochs (released by a context destruction); a stack's epochs are summed
/// into one.
pub fn snapshot(
    probes: &Probes,
    attached_at: Instant,
    live_pids: &[u32],
    exec_baselines: &std::collections::HashMap<StackKey, Counters>,
) -> Result<Snapshot> {
    let ebpf = &probes.ebpf;
    let elapsed_s = attached_at.elapsed().as_secs_f64();
    let mut stacks = contexts::fold_epochs(stack_entries(probes)?, &contexts::epochs(probes)?);
    for (key, counters) in &mut stacks {
        if let Some(gone) = exec_baselines.get(key) {
            counters.live_bytes -= gone.live_bytes;
            counters.live_allocs -= gone.live_allocs;
        }
    }
    let mut mappings = probes.mappings.borrow_mut();
    mappings.drain(&mut probes.copied.borrow_mut());
    stacks.extend(mappings.counters());
    let counters: PerCpuArray<&MapData, u64> =
        PerCpuArray::try_from(ebpf.map("STATS").context("eBPF object lacks STATS")?)?;
    let mut stats = Vec::with_capacity(stat::COUNT as usize);
    for index in 0..stat::COUNT {
        let per_cpu = counters.get(&index, 0).context("could not read STATS")?;
        stats.push(per_cpu.iter().sum());
    }
    Ok(Snapshot {
        elapsed_s,
        stacks,
        stats,
        rss_bytes: live_pids
            .iter()
            .filter_map(|&pid| Some((pid, crate::procfs::rss_bytes(pid)?)))
            .collect(),
    })
}

/// The symbolized frames of a stack, innermost first (empty when the
/// kernel could not store it).
pub fn stack_frames(probes: &Probes, symbols: &mut Symbols, key: &StackKey) -> Vec<Frame> {
    if key.stack_id == tracer_ebpf::NO_STACK {
        return Vec::new();
    }
    let ebpf = &probes.ebpf;
    let copied = probes.copied.borrow();
    if let Some(frames) = copied.frames(key.stack_id, symbols) {
        return frames;
    }
    // A mapping stack is the kernel's, or one unwound from a copy.
    let addresses = |id| match copied.addresses(id) {
        Some(addresses) => addresses.to_vec(),
        None => stack_addresses(ebpf, id),
    };
    if let Some(frames) = probes
        .mappings
        .borrow()
        .frames(key.stack_id, symbols, addresses)
    {
        return frames;
    }
    symbols.stack_frames(key.pid, &stack_addresses(ebpf, key.stack_id))
}

/// The CUDA function that made each GPU stack's memory, from STACK_API
/// and the copied stacks.
pub fn stack_apis(probes: &Probes) -> std::collections::HashMap<StackKey, &'static str> {
    let mut apis = kernel_stack_apis(&probes.ebpf);
    apis.extend(probes.copied.borrow().apis());
    apis
}

fn kernel_stack_apis(ebpf: &Ebpf) -> std::collections::HashMap<StackKey, &'static str> {
    let Some(Ok(apis)) = ebpf
        .map("STACK_API")
        .map(HashMap::<&MapData, tracer_ebpf::StackKey, u32>::try_from)
    else {
        return Default::default();
    };
    apis.iter()
        .filter_map(Result::ok)
        .filter_map(|(key, api)| {
            let key = StackKey {
                pid: key.tgid,
                stack_id: key.stack_id,
                kind: Kind::from_raw(key.kind)?,
            };
            Some((key, crate::attach::cuda::api_name(api)?))
        })
        .collect()
}

/// The return addresses of a stored stack, innermost first.
fn stack_addresses(ebpf: &Ebpf, stack_id: u32) -> Vec<u64> {
    let Some(map) = ebpf.map("STACKS") else {
        return Vec::new();
    };
    let Ok(stacks) = StackTraceMap::<&MapData>::try_from(map) else {
        return Vec::new();
    };
    stacks
        .get(&stack_id, 0)
        .map(|trace| trace.frames().iter().map(|frame| frame.ip).collect())
        .unwrap_or_default()
}

fn status_line(model: &Model) -> String {
    let totals = crate::output::live_totals(model);
    let drops: u64 = model.drops().iter().map(|(_, count)| count).sum();
    format!(
        "tracer: {:.0} s, {}, {drops} dropped",
        model.window_s(),
        if totals.is_empty() {
            "nothing live yet".to_owned()
        } else {
            totals.join(", ")
        }
    )
}
