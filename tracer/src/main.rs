//! tracer: finds the call stacks that hold growing memory in running
//! processes, with eBPF. `main` wires the stages together: cli -> attach ->
//! collect -> model -> symbolize -> output.
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};

use tracer::{
    cli::{self, Config, Parsed},
    collect::{self, Schedule, StopReason},
    error,
    model::Model,
    output,
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
    for path in config.json_path.iter().chain(&config.svg_path) {
        check_output_path(path)?;
    }
    let mut session = Session::attach(config)?;
    session.resume();
    let mut model = Model::new();
    let schedule = Schedule {
        interval: config.interval,
        duration: config.duration,
        attached_at: session.attached_at,
        status_every: Some(STATUS_EVERY),
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
        let report = session::build_report(probes, symbols, model, &targets, config);
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
    ))?;
    if reason != StopReason::TargetsExited {
        eprintln!(
            "tracer: stopping ({reason:?}) after {:.1} s",
            model.window_s()
        );
    }

    let targets = session.targets();
    let report = session::build_report(
        &session.probes,
        &mut session.symbols,
        &model,
        &targets,
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

/// Fails before attaching when an output file could not be written.
fn check_output_path(path: &std::path::Path) -> Result<()> {
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
