//! The start of a session: checks privileges, kernel and targets, loads
//! the eBPF programs, attaches them and says what was attached.
use std::time::Instant;

use anyhow::Result;

use crate::{
    attach::{self, Probes, spawn},
    collect::Collector,
    config::{Config, Targets},
    model::Target,
};

/// Checks privileges, kernel and targets, loads the eBPF programs and
/// attaches them. A spawned command is left stopped (its libraries mapped,
/// none of their constructors run) until `resume`.
pub(super) fn attach(config: &Config) -> Result<Collector> {
    crate::collect::catch_signals_during_attach();
    attach::check_privileges()?;
    attach::check_kernel()?;
    if let Targets::Pids(pids) = &config.targets {
        for &pid in pids {
            attach::check_target(pid)?;
        }
    }
    let started_at = Instant::now();
    let probing = &config.probing;
    let (mut probes, rings) =
        Probes::load(config.map_sizes, &probing.sampling, &probing.unwinding)?;
    if probing.resident {
        probes.trace_resident_pages().map_err(|error| {
            crate::error::fatal(
                crate::error::ExitCode::KernelUnsupported,
                format!("--resident: {error:#}"),
            )
        })?;
    }
    let mut collector = Collector::new(probes, rings, config.schedule)?;
    // While the targets are attached: what a trap costs here.
    collector.probes_mut().measure_traps();
    collector
        .probes_mut()
        .set_loader_pause(probing.loader_pause);
    collector.set_debug_dirs(probing.debug_dirs.clone());
    collector.set_python(probing.python);
    if config.schedule.follow_forks {
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
        collector.runtimes_summary(),
        config
            .schedule
            .duration
            .map(|duration| format!(" for {:.1} s", duration.as_secs_f64()))
            .unwrap_or_default(),
    );
    for note in collector.runtimes_attach_notes() {
        eprintln!("tracer: {note}");
    }
    for (pid, objects) in probes.copying_stacks_of() {
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
