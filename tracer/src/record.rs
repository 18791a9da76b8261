//! `tracer record`: attach, collect until a stop condition, report. While
//! tracing it writes the recording (`-o`), a status line every few seconds
//! and the growth plot (`--svg-every`); at the end the report, in text and
//! the formats asked for.
use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::Result;

use crate::{
    collect::{Collector, Event, StopReason},
    config::{RecordConfig, Targets},
    error,
    model::{Model, cost::Cost},
    output,
    recording::{self, Metadata},
    serve, session,
    symbolize::FINAL_WAIT_FOR_SYMBOLS,
};

/// How often the status line is printed on stderr while recording.
const STATUS_EVERY: Duration = Duration::from_secs(5);

/// Runs `tracer record`.
pub fn run(config: &RecordConfig) -> Result<()> {
    for path in [
        &config.json_path,
        &config.svg_path,
        &config.recording_path,
        &config.text_path,
    ]
    .into_iter()
    .flatten()
    {
        check_output_path(path)?;
    }
    let mut server = serve::start_if_asked(&config.trace, config.holders)?;
    let mut collector = session::attach(&config.trace)?;
    let mut recording = match start_recording(config, &collector) {
        Ok(recording) => recording,
        Err(error) => {
            session::kill_spawned(&collector);
            return Err(error);
        }
    };
    session::resume(&collector);
    let mut model = Model::new();
    let runtime = crate::collect::runtime()?;
    let reason = runtime.block_on(collect(
        &mut collector,
        &mut model,
        recording.as_mut(),
        server.as_mut(),
        config,
    ))?;
    // From here on a Ctrl-C cuts the last symbolization short.
    crate::symbolize::skip_final_wait_on_signals();
    if reason != StopReason::TargetsExited {
        eprintln!(
            "tracer: stopping ({reason:?}) after {:.1} s",
            model.window_s()
        );
    }
    if let Some(line) = session::exception_holds(&collector) {
        eprintln!("tracer: {line}");
    }
    let memory_status = session::memory_status(&collector.targets());
    if let Some(mut writer) = recording {
        for (&pid, &status) in &memory_status {
            writer.append_memory_status(pid, status)?;
        }
        writer.append_loader_pauses(collector.loader_pauses())?;
        let path = writer.path().to_owned();
        writer.finish()?;
        eprintln!("tracer: wrote {}", path.display());
    }
    collector.settle_symbols(FINAL_WAIT_FOR_SYMBOLS);
    let mut report = session::build_report(&mut collector, &model, memory_status, &config.trace);
    let unanswered = collector.unanswered_symbols();
    if unanswered > 0 {
        eprintln!(
            "tracer: {unanswered} addresses were still being symbolized when the last \
             wait ended ({} s at most after tracing stopped, or a second Ctrl-C): their \
             frames show module and offset (`tracer report` of a recording names them \
             again)",
            FINAL_WAIT_FOR_SYMBOLS.as_secs()
        );
    }
    if config.holders {
        session::add_holders(&mut collector, &mut report, &config.trace);
    }
    session::end_spawned(collector, reason, config.trace.leave_running);
    write_text_report(config, &output::text::render(&report))?;
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

/// The text report: to `--text FILE`, else to stdout, or to stderr when
/// tracer started the command (its stdout is the command's own).
fn write_text_report(config: &RecordConfig, text: &str) -> Result<()> {
    use std::io::Write as _;
    if let Some(path) = &config.text_path {
        std::fs::write(path, text).map_err(|error| {
            error::fatal(
                error::ExitCode::Output,
                format!("could not write {}: {error}", path.display()),
            )
        })?;
        eprintln!("tracer: wrote {}", path.display());
        return Ok(());
    }
    if matches!(config.trace.targets, Targets::Spawn(_)) {
        let mut stderr = std::io::stderr().lock();
        stderr.write_all(text.as_bytes())?;
        return Ok(());
    }
    print!("{text}");
    Ok(())
}

/// Takes the collector's events until it stops: each snapshot into the
/// model and the recording, the status line and the plot when due, and a
/// line on stderr for what happened to the targets.
async fn collect(
    collector: &mut Collector,
    model: &mut Model,
    mut recording: Option<&mut recording::Writer>,
    mut server: Option<&mut serve::Server>,
    config: &RecordConfig,
) -> Result<StopReason> {
    let mut status_printed_at = Instant::now();
    let mut cost_was_high = false;
    let mut svg_written_at = Instant::now();
    loop {
        match collector.next().await? {
            Event::Snapshot(snapshot) => {
                if let Some(writer) = recording.as_deref_mut() {
                    writer.append_snapshot(&snapshot, &mut |key| {
                        (collector.frames(key), collector.api(key).map(str::to_owned))
                    })?;
                }
                model.push(snapshot);
                let folded = model.take_folded();
                collector.forget_stacks(&folded);
                if let Some(writer) = recording.as_deref_mut() {
                    writer.forget(&folded);
                }
                if let Some(server) = server.as_deref_mut() {
                    server.publish(collector, model, &config.trace, false);
                    server.answer_holders(collector, model, &config.trace);
                }
                if status_printed_at.elapsed() >= STATUS_EVERY {
                    status_printed_at = Instant::now();
                    let cost = collector.cost_lately();
                    eprintln!("{}", status_line(model, cost.as_ref()));
                    // Said when the cost goes over the bound, not every line.
                    let advice = cost.as_ref().and_then(|cost| {
                        output::text::cost_advice(cost, &collector.probes().sampling_report())
                    });
                    if let Some(advice) = &advice
                        && !cost_was_high
                    {
                        eprintln!("tracer: WARNING: {advice}");
                    }
                    cost_was_high = advice.is_some();
                }
                if let Some(path) = &config.svg_path
                    && svg_written_at.elapsed() >= config.svg_every
                {
                    svg_written_at = Instant::now();
                    let report =
                        session::build_report(collector, model, Default::default(), &config.trace);
                    output::svg::write_svg(&report, model, config.plot_stacks, path)?;
                }
            }
            Event::TargetExited { pid, after_s } => {
                if let Some(writer) = recording.as_deref_mut() {
                    writer.append_exit(pid, after_s)?;
                }
                eprintln!("tracer: PID {pid} exited after {after_s:.1} s");
                if collector.forgets_exited() {
                    model.forget(pid);
                }
            }
            Event::LibrariesHooked(libraries) => {
                if let Some(writer) = recording.as_deref_mut() {
                    writer.append_libraries(&libraries)?;
                }
            }
            Event::ContextDestroyed { pid, after_s } => {
                eprintln!(
                    "tracer: PID {pid} destroyed or reset a CUDA context after {after_s:.1} s"
                );
            }
            Event::ChildFollowed {
                pid,
                command,
                after_s,
            } => {
                eprintln!("tracer: following child PID {pid} ({command}) after {after_s:.1} s");
            }
            Event::Notice(line) => eprintln!("tracer: {line}"),
            Event::Detail(line) if config.trace.verbose => eprintln!("tracer: {line}"),
            Event::Detail(_) => {}
            Event::Exec {
                pid,
                executable,
                after_s,
            } => {
                eprintln!(
                    "tracer: PID {pid} exec'ed {executable} after {after_s:.1} s: \
                     what the old image held is gone, the new image is traced"
                );
            }
            Event::Stopped(reason) => {
                if config.trace.verbose
                    && let Some(summary) = collector.probes().unwind_tables_summary()
                {
                    eprintln!("tracer: {summary}");
                }
                return Ok(reason);
            }
        }
    }
}

/// The status line: time, live memory, drops, and what tracer cost the
/// targets since the last line.
fn status_line(model: &Model, cost: Option<&Cost>) -> String {
    let totals = output::live_totals(model);
    let drops: u64 = model.drops().iter().map(|(_, count)| count).sum();
    let mut line = format!(
        "tracer: {:.0} s, {}, {drops} dropped",
        model.window_s(),
        if totals.is_empty() {
            "nothing live yet".to_owned()
        } else {
            totals.join(", ")
        }
    );
    if let Some(cost) = cost {
        line.push_str("; ");
        line.push_str(&output::text::cost_rate_line(cost));
    }
    line
}

/// Opens the recording (`-o FILE`), if asked for, with the metadata of the
/// trace whose probes are now in place.
fn start_recording(
    config: &RecordConfig,
    collector: &Collector,
) -> Result<Option<recording::Writer>> {
    let Some(path) = &config.recording_path else {
        return Ok(None);
    };
    let probes = collector.probes();
    let targets = collector.targets();
    let pids: Vec<u32> = targets.iter().map(|target| target.pid).collect();
    let metadata = Metadata::for_this_host(
        collector.attached_at(),
        config.trace.interval.as_millis() as u64,
        targets,
        probes.probe_reports(),
        probes.sampling_report(),
    );
    let mut writer = recording::Writer::create(path, metadata)?;
    writer.append_unwinding(&probes.unwinding_report(&pids))?;
    writer.append_libraries(&collector.library_reports())?;
    Ok(Some(writer))
}

/// Fails before attaching when an output file could not be written, so a
/// long trace never ends without its report.
fn check_output_path(path: &Path) -> Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
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
