//! tracer: finds the call stacks that hold growing memory in running
//! processes, with eBPF. `main` wires the stages together: cli -> attach ->
//! collect -> model -> symbolize -> output.
use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use tracer::{
    analyze,
    attach::{self, Probes, spawn},
    cli::{self, Config, FloorConfig, Parsed},
    collect::{self, Schedule, StopReason},
    error,
    model::Model,
    output,
    recording::{self, Metadata},
    session::{self, Session},
    top,
};

/// How often the status line is printed on stderr while recording.
const STATUS_EVERY: Duration = Duration::from_secs(5);

fn main() -> std::process::ExitCode {
    let result = cli::parse(std::env::args_os()).and_then(|parsed| match parsed {
        Parsed::Print(text) => {
            print!("{text}");
            Ok(())
        }
        Parsed::Record(config) => record(&config),
        Parsed::Top(config) => top::run(&config),
        Parsed::Report(config) => analyze::report(&config),
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
    for path in [&config.json_path, &config.svg_path, &config.recording_path]
        .into_iter()
        .flatten()
    {
        check_output_path(path)?;
    }
    let mut session = Session::attach(config)?;
    let mut recording = match start_recording(config, &session) {
        Ok(recording) => recording,
        Err(error) => {
            for watched in session.watched.iter().filter(|w| w.spawned) {
                spawn::kill(watched.target.pid);
            }
            return Err(error);
        }
    };
    session.resume();
    let mut model = Model::new();
    let schedule = Schedule {
        interval: config.interval,
        duration: config.duration,
        attached_at: session.attached_at,
        status_every: Some(STATUS_EVERY),
        follow_forks: config.follow_forks,
    };
    let Session {
        probes,
        symbols,
        watched,
        ..
    } = &mut session;
    let mut svg_written_at = Instant::now();
    let mut rewrite_svg = |probes: &tracer::attach::Probes,
                           model: &Model,
                           symbols: &mut tracer::symbolize::Symbols,
                           watched: &[collect::Watched]| {
        let Some(path) = &config.svg_path else {
            return Ok(());
        };
        if svg_written_at.elapsed() < config.svg_every {
            return Ok(());
        }
        svg_written_at = Instant::now();
        let targets: Vec<_> = watched.iter().map(|w| w.target.clone()).collect();
        let report =
            session::build_report(probes, symbols, model, &targets, BTreeMap::new(), config);
        output::svg::write_svg(&report, model, config.plot_stacks, path)
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("could not start the tokio runtime")?;
    let reason = runtime.block_on(collect::run(
        probes,
        watched,
        &mut model,
        symbols,
        &schedule,
        &mut rewrite_svg,
        recording.as_mut(),
    ))?;
    if reason != StopReason::TargetsExited {
        eprintln!(
            "tracer: stopping ({reason:?}) after {:.1} s",
            model.window_s()
        );
    }
    let targets = session.targets();
    let memory_status = session::memory_status(&targets);
    if let Some(mut writer) = recording {
        for (&pid, &status) in &memory_status {
            writer.append_memory_status(pid, status)?;
        }
        let path = writer.path().to_owned();
        writer.finish()?;
        eprintln!("tracer: wrote {}", path.display());
    }

    let report = session::build_report(
        &session.probes,
        &mut session.symbols,
        &model,
        &targets,
        memory_status,
        config,
    );
    print!("{}", output::text::render(&report));
    if let Some(path) = &config.json_path {
        output::json::write_json(&report, path)?;
        eprintln!("tracer: wrote {}", path.display());
    }
    if let Some(path) = &config.svg_path {
        output::svg::write_svg(&report, &model, config.plot_stacks, path)?;
        eprintln!("tracer: wrote {}", path.display());
    }
    Ok(())
}

/// `tracer floor` (for `cargo xtask bench`): empty programs on the
/// allocator functions of a process, until SIGINT, SIGTERM or its exit.
fn floor(config: &FloorConfig) -> Result<()> {
    attach::check_privileges()?;
    attach::check_kernel()?;
    attach::check_target(config.pid)?;
    let mut probes = Probes::load(
        attach::Capacity::DEFAULT,
        &attach::Sampling::EXACT,
        &tracer::unwind::Unwinding::FRAME_POINTERS,
    )?;
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

/// Opens the recording (`-o FILE`), if asked for, with the metadata of the
/// trace whose probes are now in place.
fn start_recording(config: &Config, session: &Session) -> Result<Option<recording::Writer>> {
    let Some(path) = &config.recording_path else {
        return Ok(None);
    };
    let metadata = Metadata::for_this_host(
        session.attached_at,
        config.interval.as_millis() as u64,
        session.targets(),
        session.probe_reports(),
        session.sampling_report(config),
    );
    let mut writer = recording::Writer::create(path, metadata)?;
    writer.append_unwinding(&session.unwinding_report())?;
    Ok(Some(writer))
}

/// Fails before attaching when an output file could not be written, so a
/// long trace never ends without its report.
fn check_output_path(path: &std::path::Path) -> Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => std::path::Path::new("."),
    };
    let fail = |why: String| {
        error::fatal(
            error::ExitCode::Output,
            format!("cannot write {}: {why}", path.display()),
        )
    };
    if !directory.is_dir() {
        return Err(fail(format!(
            "directory {} does not exist",
            directory.display()
        )));
    }
    let c_directory = std::ffi::CString::new(directory.as_os_str().as_bytes())
        .map_err(|_| fail("the path contains a NUL byte".to_owned()))?;
    // SAFETY: access reads a valid NUL-terminated path.
    if unsafe { libc::access(c_directory.as_ptr(), libc::W_OK) } != 0 {
        return Err(fail(format!(
            "directory {} is not writable ({})",
            directory.display(),
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}
