//! A tracing session: checks, loads and attaches the probes on the targets
//! of a `Config`, and builds the report of what was collected. Shared by
//! the verbs that trace (`record`, `top`).
mod holders;

pub use holders::{PendingHolders, add_holders, finish_holders, prepare_holders};

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use anyhow::Result;

use crate::{
    attach::{self, Probes, spawn},
    collect::{Collector, Schedule, StopReason},
    config::{Config, Targets},
    model::{MemoryStatus, Model, StackKey, Target},
    procfs,
    report::{Report, ReportInput, ReportView},
};

/// Checks privileges, kernel and targets, loads the eBPF programs and
/// attaches them. A spawned command is left stopped (its libraries mapped,
/// none of their constructors run) until `resume`.
pub fn attach(config: &Config) -> Result<Collector> {
    crate::collect::catch_signals_during_attach();
    attach::check_privileges()?;
    attach::check_kernel()?;
    if let Targets::Pids(pids) = &config.targets {
        for &pid in pids {
            attach::check_target(pid)?;
        }
    }
    let started_at = Instant::now();
    let capacity = attach::MapSizes {
        live_allocs: config.max_live_allocs,
        stacks: config.max_stacks,
        mapping_ring_bytes: config.ring_buffer_kib * 1024,
    };
    let (probes, rings) = Probes::load(capacity, &config.sampling, &config.unwinding)?;
    let schedule = Schedule {
        interval: config.interval,
        duration: config.duration,
        follow_forks: config.follow_forks,
    };
    let mut collector = Collector::new(probes, rings, schedule)?;
    // While the targets are attached: what a trap costs here.
    collector.probes_mut().measure_traps();
    collector.probes_mut().pause_at_loader = config.loader_pause;
    collector.set_debug_dirs(config.debug_dirs.clone());
    collector.set_python(config.python, config.python_depth, config.python_objects);
    if config.follow_forks {
        collector.probes_mut().watch_forks()?;
    }
    match &config.targets {
        Targets::Pids(pids) => {
            for &pid in pids {
                collector.add_target(pid, false)?;
            }
        }
        Targets::Spawn(command) => {
            let child =
                spawn::spawn_stopped(collector.probes_mut(), command, !config.leave_running)?;
            if let Err(error) = collector.add_target(child.pid, true) {
                spawn::kill(child.pid);
                return Err(error);
            }
            if child.gate_stays {
                collector.gate(child.pid);
            }
        }
        Targets::Comms(comms) => {
            for pid in collector
                .watch_comms(comms)?
                .into_iter()
                .take(comms.max_targets)
            {
                // A process that exits or maps no allocator meanwhile is
                // not an error: others may come.
                if let Err(error) = collector.add_target(pid, false) {
                    eprintln!(
                        "tracer: not tracing PID {pid}: {}",
                        crate::error::one_line(&error)
                    );
                }
            }
        }
    }
    let attached_at = collector.start();
    let probes = collector.probes();
    for note in probes.attach_notes(config.verbose) {
        eprintln!("tracer: {note}");
    }
    eprintln!(
        "tracer: attached {} probes to {} in {} ms ({}); tracing{} (Ctrl-C to stop and report)",
        probes.probe_count(),
        describe_targets(&collector.targets()),
        (attached_at - started_at).as_millis(),
        collector.python_summary(),
        config
            .duration
            .map(|duration| format!(" for {:.1} s", duration.as_secs_f64()))
            .unwrap_or_default(),
    );
    for (pid, why) in collector.python_unsupported() {
        eprintln!("tracer: PID {pid}: no Python frames: {why}; native frames only");
    }
    for (pid, objects) in &probes.copying_stacks_of {
        eprintln!(
            "tracer: PID {pid}: no frame pointers in {}: its stacks are copied and unwound \
             with DWARF (a Go program that calls C, or --unwind copy)",
            objects.join(", ")
        );
    }
    for note in collector.probes_mut().take_lacking_checks(false) {
        eprintln!("tracer: {note}");
    }
    let probes = collector.probes();
    if config.verbose
        && let Some(summary) = probes.unwind_tables_summary()
    {
        eprintln!("tracer: {summary} at attach");
    }
    Ok(collector)
}

/// Lets a spawned command run (nothing to do for --pid targets).
pub fn resume(collector: &Collector) {
    for watched in collector.watched().iter().filter(|watched| watched.spawned) {
        spawn::resume(watched.target.pid);
    }
}

/// Kills the commands tracer started (when tracing cannot go on).
pub fn kill_spawned(collector: &Collector) {
    for watched in collector.watched().iter().filter(|watched| watched.spawned) {
        spawn::kill(watched.target.pid);
    }
}

/// How long a spawned command may take to exit once told to stop.
const SPAWNED_EXIT_PATIENCE: Duration = Duration::from_secs(10);

/// Ends tracing (drops `collector`, removing every probe) and deals with
/// the commands tracer started that still run, saying so on stderr: they
/// are passed on the signal that stopped tracer (SIGINT for Ctrl-C,
/// SIGTERM for SIGTERM and --duration) and waited for, as `perf record`
/// does; with `--leave-running` they go on, untraced, and their PIDs are
/// named.
pub fn end_spawned(collector: Collector, reason: StopReason, leave_running: bool) {
    let running: Vec<(u32, String)> = collector
        .watched()
        .iter()
        .filter(|watched| watched.spawned && watched.exit.is_none())
        .map(|watched| (watched.target.pid, watched.target.command.clone()))
        .collect();
    drop(collector);
    for (pid, command) in running {
        if let spawn::ChildState::Exited(status) = spawn::poll(pid) {
            eprintln!("tracer: PID {pid} ({command}) ended: {status}");
            continue;
        }
        if leave_running {
            spawn::resume(pid);
            eprintln!(
                "tracer: PID {pid} ({command}) left running, no longer traced \
                 (--leave-running); stop it with `kill {pid}`"
            );
            continue;
        }
        let signal = match reason {
            StopReason::Interrupted => libc::SIGINT,
            _ => libc::SIGTERM,
        };
        eprintln!(
            "tracer: sending {} to PID {pid} ({command}), which tracer started, and waiting \
             for it to exit (--leave-running leaves it running)",
            spawn::signal_name(signal)
        );
        let (status, killed) = spawn::stop_and_wait(pid, signal, SPAWNED_EXIT_PATIENCE);
        if killed {
            eprintln!(
                "tracer: PID {pid} did not exit within {} s: killed it (SIGKILL)",
                SPAWNED_EXIT_PATIENCE.as_secs()
            );
        } else {
            eprintln!("tracer: PID {pid} ended: {status}");
        }
    }
}

/// What the holds for unwinds through return-probed frames (`attach::
/// exceptions`) cost the targets, when there were any.
pub fn exception_holds(collector: &Collector) -> Option<String> {
    let (holds, longest) = collector.probes().exceptions.as_ref()?.holds();
    (holds > 0).then(|| {
        format!(
            "{holds} C++ unwinds through return-probed frames held their process while \
             return addresses were put back (longest {:.2} ms, bound {} ms)",
            longest.as_secs_f64() * 1e3,
            crate::attach::exceptions::HOLD_BOUND.as_millis()
        )
    })
}

/// The report of what `collector` saw, folded into `model`: the stacks it
/// shows (top stacks by live bytes and suspected leaks) with their frames;
/// `memory_status` holds the RSS of the targets alive at the end (empty
/// while tracing goes on).
pub fn build_report(
    collector: &mut Collector,
    model: &Model,
    memory_status: BTreeMap<u32, MemoryStatus>,
    config: &Config,
) -> Report {
    let run = collector.run_facts(model, stacks_to_merge(model, config.top), memory_status);
    Report::build(ReportInput {
        model,
        run,
        view: ReportView {
            top: config.top,
            wrappers: &config.wrappers,
            layout: config.layout,
            at_s: None,
        },
    })
}

/// Stacks are merged with every stack of equal frames (`model::merge`)
/// while there are at most this many; beyond, only among the stacks that
/// could be shown, so that a target with 10^5 stacks still gets its report
/// in seconds.
const MERGE_ALL_UP_TO: usize = 20_000;

/// The stacks to symbolize for a report or a `top` screen showing `top`
/// stacks: every stack while there are at most [`MERGE_ALL_UP_TO`], else
/// the ones that could be shown (the most live bytes, the fastest growth,
/// the suspected leaks, several times `top` of each).
pub fn stacks_to_merge(model: &Model, top: usize) -> Vec<StackKey> {
    let all: Vec<StackKey> = model.latest_counters().map(|(key, _)| key).collect();
    if all.len() <= MERGE_ALL_UP_TO {
        return all;
    }
    let shown = top.saturating_mul(4);
    let mut keys: Vec<StackKey> = model
        .top_stacks(shown)
        .into_iter()
        .chain(model.fastest_growing(shown))
        .map(|summary| summary.key)
        .chain(model.suspected_leaks(top).into_iter().map(|(key, _)| key))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// RSS and its parts of the targets still alive, read now.
pub fn memory_status(targets: &[Target]) -> BTreeMap<u32, MemoryStatus> {
    targets
        .iter()
        .filter(|target| target.exited_after_s.is_none())
        .filter_map(|target| Some((target.pid, procfs::memory_status(target.pid)?)))
        .collect()
}

fn describe_targets(targets: &[Target]) -> String {
    if targets.is_empty() {
        return "no process yet (waiting for one with a --comm name)".to_owned();
    }
    targets
        .iter()
        .map(|target| format!("PID {} ({})", target.pid, target.command))
        .collect::<Vec<_>>()
        .join(", ")
}
