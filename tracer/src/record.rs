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
    config::{RecordConfig, Targets},
    error,
    model::{Model, cost::Cost},
    output, serve,
    session::{Ended, Live, Session, Step},
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
    let mut server = serve::start_if_asked(config.trace.listen, config.holders)?;
    let mut session = Session::attach(&config.trace)?;
    if let Some(path) = &config.recording_path
        && let Err(error) = session.record_to(path)
    {
        session.kill_spawned();
        return Err(error);
    }
    session.resume();
    let mut status = Status::default();
    let mut svg_written_at = Instant::now();
    let reason = session.run(|step, live| {
        match step {
            Step::Said(line) => eprintln!("tracer: {line}"),
            Step::Snapshot => {
                if let Some(server) = server.as_mut() {
                    server.publish(live, false);
                    server.answer_holders(live);
                }
                status.print_when_due(live);
                if let Some(path) = &config.svg_path
                    && svg_written_at.elapsed() >= config.svg_every
                {
                    svg_written_at = Instant::now();
                    let report = live.report();
                    output::svg::write_svg(&report, live.model(), config.plot_stacks, path)?;
                }
            }
        }
        Ok(())
    })?;
    let Ended { report, model } = session.finish(reason, config.holders)?;
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

/// The status line on stderr every `STATUS_EVERY`, and a warning when
/// tracer's cost goes over the bound (said when it goes over, not on every
/// line).
struct Status {
    printed_at: Instant,
    cost_was_high: bool,
}

impl Default for Status {
    fn default() -> Status {
        Status {
            printed_at: Instant::now(),
            cost_was_high: false,
        }
    }
}

impl Status {
    fn print_when_due(&mut self, live: &mut Live<'_>) {
        if self.printed_at.elapsed() < STATUS_EVERY {
            return;
        }
        self.printed_at = Instant::now();
        let cost = live.cost_lately();
        eprintln!("{}", status_line(live.model(), cost.as_ref()));
        let advice = cost
            .as_ref()
            .and_then(|cost| output::text::cost_advice(cost, &live.sampling()));
        if let Some(advice) = &advice
            && !self.cost_was_high
        {
            eprintln!("tracer: WARNING: {advice}");
        }
        self.cost_was_high = advice.is_some();
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
