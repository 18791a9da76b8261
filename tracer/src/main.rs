//! tracer: finds the call stacks that hold growing memory in running
//! processes, with eBPF. `main` wires the stages together: cli -> attach ->
//! collect -> model -> symbolize -> output.
use std::{collections::HashMap, time::Instant};

use anyhow::{Context as _, Result};

use tracer::{
    attach,
    attach::{Probes, spawn},
    cli,
    cli::{Config, FloorConfig, Parsed, Targets},
    collect,
    collect::{Schedule, StopReason, Watched},
    error,
    model::{Frame, Model, StackKey, Target},
    output,
    output::{ProbeReport, RecordingReport, Report, ReportInput},
    procfs,
    symbolize::Symbols,
};

fn main() -> std::process::ExitCode {
    let result = cli::parse(std::env::args_os()).and_then(|parsed| match parsed {
        Parsed::Print(text) => {
            print!("{text}");
            Ok(())
        }
        Parsed::Record(config) => record(&config),
        Parsed::Floor(config) => floor(&config),
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tracer: error: {}", error::one_line(&error));
            std::process::ExitCode::from(error::exit_code(&error) as u8)
        }
    }
}

/// `tracer record`: attach, collect until a stop condition, report.
fn record(config: &Config) -> Result<()> {
    attach::check_privileges()?;
    attach::check_kernel()?;
    if let Targets::Pids(pids) = &config.targets {
        for &pid in pids {
            attach::check_target(pid)?;
        }
    }
    check_output_path(config)?;

    let started_at = Instant::now();
    let mut probes = Probes::load(config.max_live_allocs, &config.recording)?;
    let mut symbols = Symbols::new();
    let mut watched = Vec::new();
    match &config.targets {
        Targets::Pids(pids) => {
            for &pid in pids {
                probes.attach_allocators(pid)?;
                symbols.refresh(pid);
                watched.push(watch(pid, false));
            }
        }
        Targets::Spawn(command) => {
            let child = spawn::spawn_stopped(&mut probes, command)?;
            if let Err(error) = probes.attach_allocators(child.pid) {
                spawn::kill(child.pid);
                return Err(error);
            }
            symbols.refresh(child.pid);
            watched.push(watch(child.pid, true));
        }
    }
    let attached_at = Instant::now();
    warn_about_probes(&probes, config.verbose);
    eprintln!(
        "tracer: attached {} probes to {} in {} ms; tracing{} (Ctrl-C to stop and report)",
        probes.probe_count(),
        describe_targets(&watched),
        (attached_at - started_at).as_millis(),
        config
            .duration
            .map(|duration| format!(" for {:.1} s", duration.as_secs_f64()))
            .unwrap_or_default(),
    );
    if matches!(config.targets, Targets::Spawn(_)) {
        spawn::resume(watched[0].target.pid);
    }

    let mut model = Model::new();
    let schedule = Schedule {
        interval: config.interval,
        duration: config.duration,
        attached_at,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("could not start the tokio runtime")?;
    let reason = runtime.block_on(collect::run(
        &probes.ebpf,
        &mut watched,
        &mut model,
        &mut symbols,
        &schedule,
    ))?;
    if reason != StopReason::TargetsExited {
        eprintln!(
            "tracer: stopping ({reason:?}) after {:.1} s",
            model.window_s()
        );
    }

    let report = build_report(config, &probes, &model, &mut symbols, &watched);
    print!("{}", output::text::render(&report));
    if let Some(path) = &config.json_path {
        output::json::write_json(&report, path)?;
        eprintln!("tracer: wrote {}", path.display());
    }
    Ok(())
}

/// Says where each probe went and why (`-v`), and warns once about every
/// single-stepped probe and about a uprobe session fallback.
fn warn_about_probes(probes: &Probes, verbose: bool) {
    for hook in &probes.hooks {
        let site = &hook.site;
        let line = format!(
            "{}+{} in {} (PID {}): {}",
            site.function.name,
            site.offset - site.function_offset,
            site.path.display(),
            hook.pid,
            site.reason
        );
        if !site.emulated {
            eprintln!("tracer: warning: probe on {line}");
        } else if verbose {
            eprintln!("tracer: probe on {line}");
        }
    }
    if verbose
        || matches!(
            probes.return_probes,
            attach::ReturnProbes::UretprobeFallback(_)
        )
    {
        eprintln!("tracer: return probes: {}", probes.return_probes.describe());
    }
}

/// `tracer floor` (for `cargo xtask bench`): empty programs on the
/// allocator functions of a process, until SIGINT, SIGTERM or its exit.
fn floor(config: &FloorConfig) -> Result<()> {
    attach::check_privileges()?;
    attach::check_kernel()?;
    attach::check_target(config.pid)?;
    let mut probes = Probes::load(1, &attach::Recording::EXACT)?;
    probes.attach_floor(config.pid, config.sites, config.with_return)?;
    eprintln!(
        "tracer: attached {} floor probes to PID {}",
        probes.probe_count(),
        config.pid
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("could not start the tokio runtime")?;
    runtime.block_on(collect::wait_for_stop(config.pid))
}

fn watch(pid: u32, spawned: bool) -> Watched {
    Watched {
        target: Target {
            pid,
            command: procfs::command_line(pid),
            exited_after_s: None,
        },
        spawned,
    }
}

fn describe_targets(watched: &[Watched]) -> String {
    watched
        .iter()
        .map(|w| format!("PID {} ({})", w.target.pid, w.target.command))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Symbolizes the stacks that make the report, then builds it.
fn build_report(
    config: &Config,
    probes: &Probes,
    model: &Model,
    symbols: &mut Symbols,
    watched: &[Watched],
) -> Report {
    let mut frames: HashMap<StackKey, Vec<Frame>> = HashMap::new();
    for summary in model.top_stacks(config.top) {
        let addresses = if summary.key.stack_id == tracer_ebpf::NO_STACK {
            Vec::new()
        } else {
            collect::stack_addresses(&probes.ebpf, summary.key.stack_id)
        };
        frames.insert(
            summary.key,
            symbols.stack_frames(summary.key.pid, &addresses),
        );
    }
    let targets: Vec<Target> = watched.iter().map(|w| w.target.clone()).collect();
    let probe_reports = probes
        .hooks
        .iter()
        .map(|hook| ProbeReport {
            pid: hook.pid,
            module: hook.site.path.display().to_string(),
            symbol: hook.site.function.name.to_owned(),
            offset: hook.site.offset,
            offset_in_function: hook.site.offset - hook.site.function_offset,
            single_stepped: !hook.site.emulated,
            reason: hook.site.reason.clone(),
        })
        .collect();
    let recording = &config.recording;
    let recording_report = RecordingReport {
        mode: if recording.sample_bytes == 0 {
            "exact"
        } else {
            "sampled"
        }
        .to_owned(),
        sample_bytes: (recording.sample_bytes != 0).then_some(recording.sample_bytes),
        min_size_bytes: recording.min_size_bytes,
        max_size_bytes: (recording.max_size_bytes != u64::MAX).then_some(recording.max_size_bytes),
        return_probes: probes.return_probes.describe(),
    };
    let lookup = |key: &StackKey| frames.get(key).cloned().unwrap_or_default();
    Report::build(ReportInput {
        model,
        targets: &targets,
        probes: probe_reports,
        recording: recording_report,
        interval_ms: config.interval.as_millis() as u64,
        top: config.top,
        frames: &lookup,
    })
}

/// Fails before attaching when the JSON report could not be written.
fn check_output_path(config: &Config) -> Result<()> {
    let Some(path) = &config.json_path else {
        return Ok(());
    };
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => std::path::Path::new("."),
    };
    if !directory.is_dir() {
        return Err(error::fatal(
            error::ExitCode::Usage,
            format!(
                "cannot write {}: directory {} does not exist",
                path.display(),
                directory.display()
            ),
        ));
    }
    Ok(())
}
