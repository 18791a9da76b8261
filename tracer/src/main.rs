//! tracer: finds the call stacks that hold growing memory in running
//! processes, with eBPF. `main` wires the stages together: cli -> attach ->
//! collect -> model -> symbolize -> output.
use std::{collections::HashMap, time::Instant};

use anyhow::{Context as _, Result};

use tracer::{
    analyze, attach,
    attach::{Probes, spawn},
    cli,
    cli::{Config, Parsed, Targets},
    collect,
    collect::{Schedule, StopReason, Watched},
    error,
    model::{Frame, Model, StackKey, Target},
    output,
    output::{ProbeReport, Report, ReportInput},
    procfs,
    recording::{self, Metadata},
    symbolize::Symbols,
};

fn main() -> std::process::ExitCode {
    let result = cli::parse(std::env::args_os()).and_then(|parsed| match parsed {
        Parsed::Print(text) => {
            print!("{text}");
            Ok(())
        }
        Parsed::Record(config) => record(&config),
        Parsed::Report(config) => analyze::report(&config),
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
    let mut probes = Probes::load(config.max_live_allocs)?;
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
    let mut recording = match start_recording(config, &probes, &watched, attached_at) {
        Ok(recording) => recording,
        Err(error) => {
            watched
                .iter()
                .filter(|w| w.spawned)
                .for_each(|w| spawn::kill(w.target.pid));
            return Err(error);
        }
    };
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
        recording.as_mut(),
    ))?;
    if reason != StopReason::TargetsExited {
        eprintln!(
            "tracer: stopping ({reason:?}) after {:.1} s",
            model.window_s()
        );
    }

    if let Some(writer) = recording {
        let path = writer.path().to_owned();
        writer.finish()?;
        eprintln!("tracer: wrote {}", path.display());
    }

    let report = build_report(config, &probes, &model, &mut symbols, &watched);
    print!("{}", output::text::render(&report));
    if let Some(path) = &config.json_path {
        output::json::write_json(&report, path)?;
        eprintln!("tracer: wrote {}", path.display());
    }
    Ok(())
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
        let stack_frames = collect::stack_frames(&probes.ebpf, symbols, &summary.key);
        frames.insert(summary.key, stack_frames);
    }
    let targets: Vec<Target> = watched.iter().map(|w| w.target.clone()).collect();
    let lookup = |key: &StackKey| frames.get(key).cloned().unwrap_or_default();
    Report::build(ReportInput {
        model,
        targets: &targets,
        probes: probe_reports(probes),
        interval_ms: config.interval.as_millis() as u64,
        top: config.top,
        frames: &lookup,
    })
}

fn probe_reports(probes: &Probes) -> Vec<ProbeReport> {
    probes
        .hooks
        .iter()
        .map(|hook| ProbeReport {
            pid: hook.pid,
            module: hook.site.path.display().to_string(),
            symbol: hook.site.function.name.to_owned(),
            offset: hook.site.offset,
            offset_in_function: hook.site.offset - hook.site.function_offset,
            single_stepped: !hook.site.emulated,
        })
        .collect()
}

/// Opens the recording (`-o FILE`), if asked for, with the metadata of the
/// trace whose probes are now in place.
fn start_recording(
    config: &Config,
    probes: &Probes,
    watched: &[Watched],
    attached_at: Instant,
) -> Result<Option<recording::Writer>> {
    let Some(path) = &config.recording_path else {
        return Ok(None);
    };
    let metadata = Metadata::for_this_host(
        attached_at,
        config.interval.as_millis() as u64,
        watched.iter().map(|w| w.target.clone()).collect(),
        probe_reports(probes),
    );
    recording::Writer::create(path, metadata).map(Some)
}

/// Fails before attaching when the JSON report or the recording could not
/// be written.
fn check_output_path(config: &Config) -> Result<()> {
    for path in [&config.json_path, &config.recording_path]
        .into_iter()
        .flatten()
    {
        check_directory_exists(path)?;
    }
    Ok(())
}

fn check_directory_exists(path: &std::path::Path) -> Result<()> {
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
