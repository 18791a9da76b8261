//! `tracer report FILE` and `tracer plot FILE`: a recording turned into any view, later and
//! elsewhere, without the target. The model is rebuilt from the recorded
//! snapshots and the report from the same `report::Report` code as a live
//! run, so the two agree number for number.

use std::{io::Write as _, path::Path};

use anyhow::{Context as _, Result};

use crate::{
    config::{ReportConfig, ReportFormat},
    output,
    recording::{self, Filter},
    report::{Report, ReportInput, ReportView},
    symbolize::OfflineSymbols,
};

/// Stacks in a text or JSON report unless --top says otherwise: the live
/// run's default.
const DEFAULT_TOP: usize = 10;

/// Reads the recording, builds the report and writes it in the chosen
/// format.
pub fn report(config: &ReportConfig) -> Result<()> {
    let mut recording = recording::read(&config.recording_path)?;
    if let Some(warning) = recording.warning() {
        eprintln!("tracer: warning: {warning}");
    }
    let filter = Filter {
        pid: config.pid,
        kind: config.kind,
        from_s: config.from_s,
        to_s: config.to_s,
    };
    let top = config.top.unwrap_or(match config.format {
        ReportFormat::Text | ReportFormat::Json | ReportFormat::Svg => DEFAULT_TOP,
        ReportFormat::Folded | ReportFormat::Pprof | ReportFormat::Flamegraph => usize::MAX,
    });
    let model = recording.model(&filter);
    let mut symbols =
        (!config.debug_dirs.is_empty()).then(|| OfflineSymbols::new(config.debug_dirs.clone()));
    let run = recording.run_facts(&filter, |frames| match &mut symbols {
        Some(symbols) => symbols.fill(frames),
        None => frames,
    });
    let report = Report::build(ReportInput {
        model: &model,
        run,
        view: ReportView {
            top,
            wrappers: &config.wrappers,
            layout: config.layout,
            at_s: config.at_s,
        },
    });
    let bytes = render(&report, &model, config)?;
    match &config.output_path {
        Some(path) => write_file(path, &bytes),
        None => std::io::stdout()
            .write_all(&bytes)
            .context("could not write to standard output"),
    }
}

fn render(report: &Report, model: &crate::model::Model, config: &ReportConfig) -> Result<Vec<u8>> {
    Ok(match config.format {
        ReportFormat::Text => output::text::render(report).into_bytes(),
        ReportFormat::Json => {
            let mut json = output::json::to_json(report);
            json.push('\n');
            json.into_bytes()
        }
        ReportFormat::Folded => output::folded::render(report, config.value).into_bytes(),
        ReportFormat::Pprof => output::pprof::render(report),
        ReportFormat::Flamegraph => output::flamegraph::render(report, config.value)?,
        ReportFormat::Svg => output::svg::render(report, model, config.plot_stacks)?.into_bytes(),
    })
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    output::file::write_private(path, bytes)?;
    eprintln!("tracer: wrote {}", path.display());
    Ok(())
}
